"""What a GGUF file says about itself, read from its header without loading it: the
geometry the gate prices a llama.cpp load from (bytes per layer, KV bytes per token,
which layers attend to a sliding window), its trained context and its chat template (the
model card's). A file on this disk and a file on the Hub alike from its header's bytes
(app.engines.gguf_header), through `facts_of`."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engines.gguf_header import GgufHeader, HeaderIncomplete, read_header

HEADER_READ = 4 * 2**20  # a local file's first read for its header (more where it is longer)

# KV element sizes by llama.cpp cache type: f16 2 bytes; q8_0 34 bytes a block of 32;
# q4_0 18 bytes a block of 32 (ggml.c's type traits)
KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
_BLOCK = re.compile(r"^blk\.(\d+)\.")
# Sliding-window attention as llama.cpp derives it for the architectures it knows
# (src/llama-model.cpp, load_hparams): (period, default window). Every `period`th layer
# attends to the whole context, the others to the last `window` tokens
# (llama_hparams::set_swa_pattern: layer il slides where il % period < period - 1); the
# window is `{arch}.attention.sliding_window`, else the default (None: without the key,
# no layer slides).
_SLIDING: dict[str, tuple[int, int | None]] = {"gemma2": (2, 4096), "gemma3": (6, None)}


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
    vocab: int = 0  # its vocabulary's tokens, a row of logits (0: unsaid)
    sliding_window: int = 0  # the tokens a sliding-window layer attends to (0: none)
    sliding: tuple[bool, ...] = ()  # for each layer, whether it slides (empty: none does)

    def kv_bytes_per_token(self, kv_type: str, layers: int | None = None) -> int:
        """One token's KV cells in `layers` layers (all, by default) at `kv_type`, as if
        every layer held every token (a sliding-window layer holds fewer: `kv_bytes`)."""
        count = self.layers if layers is None else layers
        return int(count * self.kv_width * KV_BYTES_PER_ELEMENT[kv_type])

    def kv_bytes(
        self, kv_type: str, cells: int, window_cells: int, layers: range | None = None
    ) -> int:
        """The KV cache's bytes in `layers` (all, by default) at `kv_type`: `cells` cells
        in a layer that attends to the whole context, `window_cells` in a sliding-window
        one (what the engine sizes its window's cache at)."""
        chosen = range(self.layers) if layers is None else layers
        sliding = sum(1 for i in chosen if i < len(self.sliding) and self.sliding[i])
        whole = len(chosen) - sliding
        return (
            self.kv_bytes_per_token(kv_type, whole) * cells
            + self.kv_bytes_per_token(kv_type, sliding) * window_cells
        )


def read_gguf_facts(path: Path) -> GgufFacts:
    """The facts of the GGUF at `path`, from its header's bytes alone
    (app.engines.gguf_header: 0.2 s for SmolLM2-135M's, where gguf's reader, which maps
    every tensor and reads every token, took 2.5 s: a config applied in the server's
    event loop held it that long); ValueError when it is no GGUF or lacks them."""
    wanted = HEADER_READ
    try:
        with path.open("rb") as file:
            while True:
                file.seek(0)
                data = file.read(wanted)
                try:
                    header = read_header(data)
                    break
                except HeaderIncomplete as short:
                    if len(data) < wanted:  # the file ends inside its header
                        raise ValueError(f"{path.name} ends inside its GGUF header") from None
                    wanted = max(short.needed, wanted * 2)
        size = path.stat().st_size
    except OSError as exc:
        raise ValueError(f"{path.name} cannot be read: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{path.name} is not a GGUF file this reader knows: {exc}") from exc
    return header_facts(header, header.tensors, size, path.name)


def header_facts(
    header: GgufHeader, tensors: Iterable[tuple[str, int]], file_bytes: int, name: str
) -> GgufFacts:
    """The facts of a GGUF read from its header's bytes alone (app.engines.gguf_header):
    its metadata, and the tensors of all its files (a split GGUF's shards list their own),
    `file_bytes` the files' sizes together."""
    return facts_of(header.metadata.get, tensors, file_bytes, name, header.lengths.get)


def facts_of(
    get: Callable[[str], Any],
    tensors: Iterable[tuple[str, int]],
    file_bytes: int,
    name: str,
    length: Callable[[str], int | None] = lambda key: None,
) -> GgufFacts:
    """The facts from a GGUF's metadata (`get(key)`, None where it lacks the key) and its
    tensors' names and bytes, however they were read; `length(key)`: an array's length
    where `get` does not give the array (a header's long ones)."""

    def read(key: str, default: Any = None) -> Any:
        found = get(key)
        return default if found is None else found

    arch = str(read("general.architecture", ""))
    if not arch:
        raise ValueError(f"{name} names no architecture (general.architecture)")
    layers = int(read(f"{arch}.block_count", 0))
    heads = int(read(f"{arch}.attention.head_count", 1) or 1)
    kv_heads_value = read(f"{arch}.attention.head_count_kv", heads)
    kv_heads = int(max(kv_heads_value) if isinstance(kv_heads_value, list) else kv_heads_value)
    width = int(read(f"{arch}.embedding_length", 0))
    key_length = int(read(f"{arch}.attention.key_length", width // heads if heads else 0))
    value_length = int(read(f"{arch}.attention.value_length", key_length))
    per_layer = [0] * layers
    other = 0
    for tensor, nbytes in tensors:
        found = _BLOCK.match(tensor)
        if found is not None and int(found.group(1)) < layers:
            per_layer[int(found.group(1))] += nbytes
        else:
            other += nbytes
    window, sliding = _sliding(arch, layers, read)
    template = read("tokenizer.chat_template")
    tokens = get("tokenizer.ggml.tokens")
    vocab = read(f"{arch}.vocab_size") or (
        len(tokens) if isinstance(tokens, list) else length("tokenizer.ggml.tokens")
    )
    return GgufFacts(
        architecture=arch,
        layers=layers,
        context_length=int(read(f"{arch}.context_length", 0) or 0),
        width=width,
        kv_width=kv_heads * (key_length + value_length),
        layer_bytes=tuple(per_layer),
        other_bytes=other,
        chat_template=template if isinstance(template, str) else None,
        file_bytes=file_bytes,
        quantization=_file_type(read("general.file_type")),
        pooling=_POOLING.get(int(read(f"{arch}.pooling_type", -1) or -1)),
        vocab=int(vocab or 0),
        sliding_window=window,
        sliding=sliding,
    )


def _sliding(
    arch: str, layers: int, read: Callable[[str, Any], Any]
) -> tuple[int, tuple[bool, ...]]:
    """The sliding window and which layers use it, as llama.cpp derives them (`_SLIDING`);
    (0, ()) for an architecture it gives none."""
    if arch not in _SLIDING:
        return 0, ()
    period, default = _SLIDING[arch]
    window = int(read(f"{arch}.attention.sliding_window", default) or 0)
    if window <= 0:
        return 0, ()
    return window, tuple(i % period < period - 1 for i in range(layers))


# llama.cpp's enum llama_pooling_type (include/llama.h), as GGUF files store it
_POOLING = {1: "mean", 2: "cls", 3: "last", 4: "rank"}


def _file_type(value: Any) -> str:
    import gguf

    try:
        return gguf.LlamaFileType(int(value)).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return "unknown"
