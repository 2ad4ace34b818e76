"""What a GGUF file says about itself, read from its header without loading it: the
geometry the gate prices a llama.cpp load from (bytes per layer, KV bytes per token),
its trained context and its chat template (the model card's)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# KV element sizes by llama.cpp cache type: f16 2 bytes; q8_0 34 bytes a block of 32;
# q4_0 18 bytes a block of 32 (ggml.c's type traits)
KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class GgufFacts:
    architecture: str
    layers: int
    context_length: int  # what it was trained for
    width: int  # the hidden (embedding) width
    kv_width: int  # K and V elements a token holds in one layer (both together)
    layer_bytes: tuple[int, ...]  # each block's weight bytes, in order
    other_bytes: int  # weights outside the blocks (embeddings, output head)
    chat_template: str | None
    file_bytes: int
    quantization: str = "unknown"  # its file type, as llama.cpp names it: Q4_1, Q8_0, F16
    pooling: str | None = None  # an embedding model's: mean, cls, last, rank (None: unsaid)

    def kv_bytes_per_token(self, kv_type: str, layers: int | None = None) -> int:
        """One token's KV cells in `layers` layers (all, by default) at `kv_type`."""
        count = self.layers if layers is None else layers
        return int(count * self.kv_width * KV_BYTES_PER_ELEMENT[kv_type])


def _value(field: Any) -> Any:
    """A scalar, string or list field's value (through `parts`, as every gguf since
    0.10 stores them; `contents()` came later)."""
    parts = [field.parts[i] for i in field.data]
    if not parts:
        return None
    if len(field.types) and field.types[0].name == "STRING":
        return bytes(parts[0]).decode("utf-8", errors="replace")
    if len(field.types) and field.types[0].name == "ARRAY":
        return [p.tolist() for p in parts]
    return parts[0].tolist()[0] if hasattr(parts[0], "tolist") else parts[0]


def read_gguf_facts(path: Path) -> GgufFacts:
    """The facts of the GGUF at `path`; ValueError when it is no GGUF or lacks them."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # gguf raises ValueError, struct errors, OSError alike
        raise ValueError(f"{path.name} is not a GGUF file gguf can read: {exc}") from exc

    def get(key: str, default: Any = None) -> Any:
        field = reader.fields.get(key)
        return default if field is None else _value(field)

    arch = str(get("general.architecture", ""))
    if not arch:
        raise ValueError(f"{path.name} names no architecture (general.architecture)")
    layers = int(get(f"{arch}.block_count", 0))
    heads = int(get(f"{arch}.attention.head_count", 1) or 1)
    kv_heads_value = get(f"{arch}.attention.head_count_kv", heads)
    kv_heads = int(max(kv_heads_value) if isinstance(kv_heads_value, list) else kv_heads_value)
    width = int(get(f"{arch}.embedding_length", 0))
    key_length = int(get(f"{arch}.attention.key_length", width // heads if heads else 0))
    value_length = int(get(f"{arch}.attention.value_length", key_length))
    per_layer = [0] * layers
    other = 0
    for tensor in reader.tensors:
        found = _BLOCK.match(tensor.name)
        if found is not None and int(found.group(1)) < layers:
            per_layer[int(found.group(1))] += int(tensor.n_bytes)
        else:
            other += int(tensor.n_bytes)
    template = get("tokenizer.chat_template")
    return GgufFacts(
        architecture=arch,
        layers=layers,
        context_length=int(get(f"{arch}.context_length", 0) or 0),
        width=width,
        kv_width=kv_heads * (key_length + value_length),
        layer_bytes=tuple(per_layer),
        other_bytes=other,
        chat_template=template if isinstance(template, str) else None,
        file_bytes=path.stat().st_size,
        quantization=_file_type(get("general.file_type")),
        pooling=_POOLING.get(int(get(f"{arch}.pooling_type", -1) or -1)),
    )


# llama.cpp's enum llama_pooling_type (include/llama.h), as GGUF files store it
_POOLING = {1: "mean", 2: "cls", 3: "last", 4: "rank"}


def _file_type(value: Any) -> str:
    import gguf

    try:
        return gguf.LlamaFileType(int(value)).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return "unknown"
