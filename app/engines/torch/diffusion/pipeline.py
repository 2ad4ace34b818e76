"""Loading a text-to-image pipeline with diffusers, and the schedulers a request may name.

- A diffusers folder (`model_index.json`): `AutoPipelineForText2Image.from_pretrained`,
  safetensors only (never unpickled), local files only.
- A single-file checkpoint (`.safetensors`, as people download them): the pipeline class
  from `pipeline_config`'s `model_index.json` when given (a diffusers folder holding the
  configs, nothing fetched), else SDXL's or SD's class by the checkpoint's own keys; its
  component configs then come from that folder, or from the Hugging Face cache or Hub as
  diffusers' `from_single_file` fetches them.

A pipeline object keeps per-call state (its scheduler's timesteps and step index, its
guidance scale): every run gets its own pipeline over the same loaded modules, with a
fresh scheduler (`for_run`), so runs on several inference threads never share one. An
image-to-image or inpainting run gets diffusers' own pipeline for that task over the same
modules (`AutoPipelineForImage2Image/Inpainting.from_pipe`): no second copy of weights.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import struct
from pathlib import Path
from typing import Any

from app.models.image_prompt import SCHEDULERS

# Scheduler names a request may give: A1111's familiar samplers, as diffusers' classes
# and the config they are built with over the pipeline's own scheduler config.
SCHEDULER_CLASSES: dict[str, tuple[str, dict[str, Any]]] = {
    "euler": ("EulerDiscreteScheduler", {}),
    "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    "ddim": ("DDIMScheduler", {}),
    "pndm": ("PNDMScheduler", {"skip_prk_steps": True}),
    "lms": ("LMSDiscreteScheduler", {}),
    "heun": ("HeunDiscreteScheduler", {}),
    "dpm++_2m": ("DPMSolverMultistepScheduler", {}),
    "dpm++_2m_karras": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
    "unipc": ("UniPCMultistepScheduler", {}),
}
assert tuple(SCHEDULER_CLASSES) == SCHEDULERS, "every scheduler a request may name, and only those"


def load_pipeline(path: Path, dtype: Any, pipeline_config: Path | None = None) -> Any:
    """The text-to-image pipeline at `path` (a diffusers folder or a single file), its
    weights in `dtype`, on the CPU; the caller moves it to its device."""
    import diffusers

    if path.is_dir():
        pipeline = diffusers.AutoPipelineForText2Image.from_pretrained(
            path, dtype=dtype, use_safetensors=True, local_files_only=True
        )
    else:
        if path.suffix.lower() != ".safetensors":
            raise ValueError(f"{path.name}: a diffusers folder or a .safetensors checkpoint")
        cls = getattr(diffusers, single_file_class(path, pipeline_config))
        extra = {"config": str(pipeline_config)} if pipeline_config is not None else {}
        pipeline = cls.from_single_file(
            str(path), dtype=dtype, local_files_only=pipeline_config is not None, **extra
        )
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def single_file_class(path: Path, pipeline_config: Path | None) -> str:
    """The pipeline class a single-file checkpoint loads as."""
    if pipeline_config is not None:
        index = json.loads((pipeline_config / "model_index.json").read_text(encoding="utf-8"))
        return str(index["_class_name"])
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as checkpoint:
        keys = list(checkpoint.keys())
    sdxl = any(key.startswith("conditioner.embedders.1.") for key in keys)
    return "StableDiffusionXLPipeline" if sdxl else "StableDiffusionPipeline"


def for_run(
    pipeline: Any, scheduler: str | None, task: str = "text2image", tiled: bool = False
) -> Any:
    """A pipeline of its own for one run of `task` (text2image, image2image, inpainting):
    the same loaded modules, a fresh scheduler (`scheduler` by name, else the pipeline's
    own kind), tokenizers of its own (a fast tokenizer's truncation and padding are
    state its calls set: two runs sharing one may get each other's), and the pipeline's
    settings. `tiled`: its VAE decodes (and encodes) in
    tiles, through a shallow copy of the loaded VAE with tiling on (the same weights;
    `enable_tiling` on the shared one would tile every run on every thread)."""
    import diffusers

    own: dict[str, Any] = {  # tokenizers keep per-call state: each run its own copy
        name: copy.deepcopy(tokenizer)
        for name in ("tokenizer", "tokenizer_2")
        if (tokenizer := getattr(pipeline, name, None)) is not None
    }
    if tiled:
        own["vae"] = copy.copy(pipeline.vae)
        own["vae"].use_tiling = True  # what enable_tiling() sets

    config = pipeline.scheduler.config
    if scheduler is None:
        fresh = type(pipeline.scheduler).from_config(config)
    else:
        name, overrides = SCHEDULER_CLASSES[scheduler]
        fresh = getattr(diffusers, name).from_config(config, **overrides)
    if task != "text2image":
        auto = {
            "image2image": diffusers.AutoPipelineForImage2Image,
            "inpainting": diffusers.AutoPipelineForInpainting,
        }[task]
        other = auto.from_pipe(pipeline, scheduler=fresh, **own)
        other.set_progress_bar_config(disable=True)
        return other
    parameters = inspect.signature(type(pipeline).__init__).parameters
    components = {**pipeline.components, "scheduler": fresh, **own}
    settings = {
        name: pipeline.config[name]
        for name in parameters
        if name in pipeline.config and name not in components and not name.startswith("_")
    }
    run = type(pipeline)(**components, **settings)
    run.set_progress_bar_config(disable=True)
    return run


_FLOATS = {"F64", "F32", "F16", "BF16"}  # cast to the pipeline's dtype at load; others kept


def weights_bytes_on(path: Path, element: int) -> int:
    """The bytes the pipeline's weights take once loaded in `element`-byte floats, from
    its safetensors files' headers (nothing else is read): a folder's files without a
    variant (`x.fp16.safetensors` is not what a plain load takes), or the single file."""
    if path.is_file():
        files = [path]
    else:
        files = [f for f in path.rglob("*.safetensors") if "." not in f.stem]
    return sum(_tensor_bytes(file, element) for file in files)


def _tensor_bytes(file: Path, element: int) -> int:
    with file.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    total = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        if tensor["dtype"] in _FLOATS:
            total += math.prod(tensor["shape"]) * element
        else:
            start, end = tensor["data_offsets"]
            total += end - start
    return total
