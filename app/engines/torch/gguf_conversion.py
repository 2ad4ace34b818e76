"""A GGUF file as a safetensors folder for the torch engine (`vramgate pull --convert`,
or a pull where llama.cpp's engine is not installed), written tensor by tensor in 16-bit.

Memory: a pull may run inside the serving process (the dashboard's pull), so it never
holds the model: each tensor is dequantised alone (float32, one tensor), rounded to
16-bit and appended to the file; a mixture-of-experts block, whose experts transformers
merges from several GGUF tensors, is held until its block ends. The names, the reverse
permutations and the merges are transformers' own (the code its GGUF loading runs), so
the folder holds what `from_pretrained(gguf_file=...)` would have built.

The check, without loading the model: every tensor the model class built from the
GGUF's config expects is there with its shape, nothing else is, and each is finite.
float16 is preferred (finer); a weight beyond its range (65504) makes it bfloat16.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.engines.torch.families import refusal

WEIGHTS_FILE = "model.safetensors"
HEADER_ROOM_PER_TENSOR = 512  # bytes of header per GGUF tensor: a name, a shape, offsets
SAFETENSORS_DTYPES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32"}
BLOCK = re.compile(r"^blk\.(\d+)\.")


class NotConvertible(Exception):
    """A GGUF the torch engine cannot take as it is (`pull` says why, as a PullError)."""


class Overflow(Exception):
    """A weight beyond the 16-bit type's range: it would be saved as inf."""


class SafetensorsWriter:
    """One safetensors file written a tensor at a time, never holding more than one: the
    data follow a header room reserved up front; the header, written last, is padded with
    spaces to fill it (the format allows trailing spaces)."""

    def __init__(self, path: Path, room: int) -> None:
        self._file = path.open("wb")
        self._room = -(-room // 8) * 8  # the data start 8-aligned
        self._file.seek(8 + self._room)
        self._entries: dict[str, Any] = {}
        self._offset = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
        self._file.write(raw.data)
        end = self._offset + raw.nbytes
        dtype = SAFETENSORS_DTYPES[tensor.dtype]
        self._entries[name] = {
            "dtype": dtype,
            "shape": list(tensor.shape),
            "data_offsets": [self._offset, end],
        }
        self._offset = end

    def close(self) -> None:
        header = json.dumps({"__metadata__": {"format": "pt"}, **self._entries}).encode()
        if len(header) > self._room:
            self._file.close()
            raise NotConvertible(
                f"the safetensors header needs {len(header)} bytes, over {self._room}"
            )
        self._file.seek(0)
        self._file.write(self._room.to_bytes(8, "little") + header.ljust(self._room, b" "))
        self._file.close()

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(entry["shape"]) for name, entry in self._entries.items()}


def convert_gguf(gguf: Path, target: Path, say: Any) -> torch.dtype:
    """`gguf` as a safetensors folder in `target` (config, tokenizer, weights); returns the
    16-bit type it was written in. `say` takes a line for the person."""
    from transformers import AutoConfig, AutoTokenizer

    say(f"converting {gguf.name} to a safetensors folder, tensor by tensor (once)")
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    why = refusal(config.model_type)
    if why is not None:
        raise NotConvertible(f"{gguf.name} cannot be converted for the torch engine: {why}")
    target.mkdir(parents=True, exist_ok=True)
    try:
        shapes = write_weights(gguf, config, target / WEIGHTS_FILE, torch.float16)
        dtype = torch.float16
    except Overflow as exc:
        say(f"{exc}: beyond float16's range; writing bfloat16 instead")
        shapes = write_weights(gguf, config, target / WEIGHTS_FILE, torch.bfloat16)
        dtype = torch.bfloat16
    check_complete(config, shapes)
    config.dtype = dtype
    config.save_pretrained(target)
    tokenizer = AutoTokenizer.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True
    )
    tokenizer.save_pretrained(target)
    say(
        f"checked: {len(shapes)} tensors in {str(dtype).removeprefix('torch.')}, all finite, "
        "each one the model expects"
    )
    return dtype


def write_weights(
    gguf: Path, config: Any, path: Path, dtype: torch.dtype
) -> dict[str, tuple[int, ...]]:
    """Every tensor of `gguf` under transformers' name, in `dtype`, into `path`."""
    from gguf import GGUFReader

    reader = GGUFReader(gguf)
    writer = SafetensorsWriter(path, HEADER_ROOM_PER_TENSOR * len(reader.tensors) + 4096)
    try:
        for name, tensor in hf_tensors(gguf, reader, config):
            rounded = tensor.to(dtype)
            if not bool(torch.isfinite(rounded).all()):
                raise Overflow(f"{name} holds a weight of {float(tensor.abs().max()):.4g}")
            writer.add(name, rounded)
    finally:
        writer.close()
    return writer.shapes()


def hf_tensors(gguf: Path, reader: Any, config: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The GGUF's tensors one at a time, dequantised, processed (reverse permutations,
    merges) and named as transformers' GGUF loading does. A processor that merges
    several GGUF tensors into one (a block's experts) leaves it in `merged`, which is
    handed on at the end of each block."""
    from gguf import dequantize
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
        read_field,
    )

    architecture = read_field(reader, "general.architecture")[0]
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=False)  # its config, as a dict
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])
    names = get_gguf_hf_weights_map(meta_model(config), processor)
    merged: dict[str, torch.Tensor] = {}
    block = None
    for tensor in reader.tensors:
        here = BLOCK.match(tensor.name)
        if here and here[1] != block:
            yield from _drain(merged)
            block = here[1]
        weights = dequantize(tensor.data, tensor.tensor_type)
        result = processor.process(
            weights=weights,
            name=tensor.name,
            tensor_key_mapping=names,
            parsed_parameters={"tensors": merged, "config": parsed["config"]},
        )
        if result.name is not None and result.name in names:
            yield (
                names[result.name],
                torch.from_numpy(np.require(result.weights, requirements=["C", "W"])),
            )
    yield from _drain(merged)


def _drain(merged: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    while merged:
        yield merged.popitem()


def meta_model(config: Any) -> Any:
    """The model class built from `config` on the meta device: its names and shapes,
    without a byte of weights."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def check_complete(config: Any, shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuses a folder that lacks a tensor the model expects (transformers would start it
    from random numbers), has one it does not, or one of another shape."""
    model = meta_model(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    tied = (
        set(getattr(model, "_tied_weights_keys", None) or ())
        if config.tie_word_embeddings
        else set()
    )
    missing = sorted(set(expected) - set(shapes) - tied)
    extra = sorted(set(shapes) - set(expected))
    wrong = sorted(n for n in set(expected) & set(shapes) if expected[n] != shapes[n])
    if missing or extra or wrong:
        raise NotConvertible(
            "the converted model does not match its architecture: "
            f"missing {missing[:5]}, unexpected {extra[:5]}, other shapes {wrong[:5]}"
        )
