"""Image models: a TorchScript file, or a torchvision architecture (`arch`) with a local
weights file (safetensors, or a state dict read with `torch.load(weights_only=True)`).

Two outputs: class scores (labels from `labels.txt` next to the model, one per line) and
image-to-image (the output tensor, clamped to [0, 1], encoded as PNG). Decoding, scaling
and normalising (ImageNet mean and std), and PNG encoding run on the CPU pool; only the
forward pass holds device memory. Images keep their own resolution (the models are
expected to be convolutional with adaptive pooling, as torchvision's classifiers are).

Bucket: the longer side rounded up to a power of two (at least 64) × the batch rounded up
(`r512xb2`). Images of exactly the same size batch together into one forward.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.config.settings import ModelSpec
from app.devices.base import Device
from app.devices.torch_backed import torch_device_of
from app.engines.torch.module import TorchModule
from app.errors import InvalidRequest
from app.models.images import decode_rgb, encode_png
from app.models.kinds import ImageModel
from app.models.prepared import Bucket, Prepared, next_pow2
from app.models.stages import InThreads

MIN_SIDE_BUCKET = 64
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
SCRIPT_SUFFIXES = {".pt", ".ts", ".torchscript", ".jit"}
LABELS_FILE = "labels.txt"


def load_module(path: Path, arch: str | None, classes: int, device: torch.device) -> Any:
    """A TorchScript file, or `arch` from torchvision with the weights in `path`."""
    if arch is None:
        if path.suffix not in SCRIPT_SUFFIXES:
            raise ValueError(
                f"{path.name}: a TorchScript file ({'/'.join(SCRIPT_SUFFIXES)}) or arch"
            )
        return torch.jit.load(str(path), map_location=device)
    import torchvision.models  # optional: only for architecture + weights models

    builder = getattr(torchvision.models, arch, None)
    if builder is None:
        raise ValueError(f"torchvision has no architecture {arch!r}")
    module = builder(num_classes=classes) if classes else builder()
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)  # never unpickle code
    module.load_state_dict(state)
    return module.to(device)


class VisionHandler(InThreads, TorchModule, ImageModel):
    kind = "vision"
    postprocess_on_loop = False  # PNG encoding and score lists stay off the event loop

    def __init__(self, spec: ModelSpec, max_side: int = 4096, max_pixels: int = 2**24) -> None:
        super().__init__(spec)
        assert spec.path is not None, "ModelSpec checks that a vision model has a path"
        self.path = Path(spec.path)
        self.output = spec.output
        self.labels = self._read_labels()
        self.dimensions = len(self.labels)
        self.max_side, self.max_pixels = max_side, max_pixels
        self._module: Any = None
        self._device = torch.device("cpu")

    def _read_labels(self) -> list[str]:
        folder = self.path if self.path.is_dir() else self.path.parent
        labels = folder / LABELS_FILE
        if not labels.is_file():
            return []
        return [
            line.strip() for line in labels.read_text(encoding="utf-8").splitlines() if line.strip()
        ]

    def expected_weights_bytes(self, device: Device) -> int:
        return self.path.stat().st_size if self.path.is_file() else 0  # float32 as saved

    def load(self, device: Device) -> None:
        self.dtype = "float32"
        module = load_module(self.path, self.spec.arch, len(self.labels), torch_device_of(device))
        self._module = module.eval()
        self._device = torch_device_of(device)

    def torch_module(self) -> Any:
        return self._module

    def unload(self) -> None:
        self._module = None
        gc.collect()

    def preprocess(self, images: list[Any]) -> Prepared:
        if not all(isinstance(item, bytes) for item in images):
            raise InvalidRequest(f"model {self.name!r} takes images", param="model")
        pixels = [decode_rgb(data, self.max_side, self.max_pixels) for data in images]
        if len({p.shape for p in pixels}) != 1:
            raise InvalidRequest(
                "the images of one request must share one size; send them separately",
                param="image",
            )
        return self._prepared(normalise_batch(pixels))

    def _prepared(self, batch: torch.Tensor) -> Prepared:
        count, _, height, width = batch.shape
        side = next_pow2(max(height, width), MIN_SIDE_BUCKET)
        size = next_pow2(count)
        return Prepared(
            Bucket(f"r{side}xb{size}", side * side * size),
            batch,
            count * height * width,
            count=count,
            longest=max(height, width),
        )

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        if len(parts) == 1:
            return parts[0]
        shapes = {tuple(p.payload.shape[1:]) for p in parts}
        if len(shapes) != 1 or sum(p.count for p in parts) > self.spec.max_batch:
            return None
        return self._prepared(torch.cat([p.payload for p in parts]))

    def forward(self, prepared: Prepared) -> Any:
        self.forward_calls += 1
        with torch.inference_mode():
            out = self._module(prepared.payload.to(self._device, non_blocking=True))
            if self.output == "classes":
                return torch.softmax(out.float(), dim=1).cpu()
            return (out.float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()

    def postprocess(self, raw: Any) -> Any:
        if self.output == "classes":
            return raw.numpy()
        return [encode_png(image.permute(1, 2, 0).squeeze(-1).numpy()) for image in raw]

    def prime(self) -> None:
        self.forward(self._prepared(torch.zeros(1, 3, 64, 64)))
        self.forward_calls = 0

    def warmup_image(self) -> bytes:
        return encode_png(np.full((64, 64, 3), 128, dtype=np.uint8))

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "path": str(self.path),
            "output": self.output,
            "labels": len(self.labels),
        }


def normalise_batch(images: list[np.ndarray]) -> torch.Tensor:
    """N × HWC uint8 of one size → NCHW float, ImageNet-normalised.

    In numpy, on purpose: this runs on the CPU stage's threads, and torch work there would
    give each of them an OpenMP team of its own (see `Executor.run_in_own_thread`)."""
    batch = np.stack(images).astype(np.float32) / np.float32(255)
    batch = (batch - MEAN) / STD
    return torch.from_numpy(np.ascontiguousarray(batch.transpose(0, 3, 1, 2)))
