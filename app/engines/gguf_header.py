"""A GGUF file's header read from its first bytes alone: its metadata and its tensors'
names and sizes, without the tensors' data. What a remote GGUF needs before it is
downloaded (app.store.hub_header fetches the bytes with HTTP Ranges), and a local file's
(app.engines.gguf_facts reads its first bytes).

GGUF (version 2 and 3, little-endian): the magic `GGUF`, the version (uint32), the tensor
count and the metadata count (uint64 each); then each metadata key (a string: uint64
length and UTF-8 bytes), its type (uint32) and value; then each tensor's name, its
dimension count (uint32), dimensions (uint64 each), type (uint32) and data offset
(uint64). Pure: bytes in, a header (or how far the bytes fell short) out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"GGUF"
# GGUF's metadata value types: their struct format (little-endian) by number
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALARS |= {11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
ARRAY_KEPT = 4096  # a longer array (a tokenizer's tokens, merges) is stepped over, unread


class HeaderIncomplete(ValueError):
    """The bytes end inside the header: more are needed (at least `needed` in all)."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"the GGUF header goes past byte {needed}")
        self.needed = needed


@dataclass(frozen=True)
class GgufHeader:
    metadata: dict[str, Any]  # scalars, strings, short arrays (long ones: None)
    tensors: tuple[tuple[str, int], ...]  # each tensor's name and its data's bytes
    end: int  # where the header's tensor infos end
    lengths: dict[str, int] = field(default_factory=dict)  # the long arrays' lengths


class _Cursor:
    """Reads GGUF's little-endian values from `data`, from `at` on."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0
        self.skipped: int | None = None  # the length of the last array stepped over

    def take(self, count: int) -> bytes:
        end = self.at + count
        if end > len(self.data):
            raise HeaderIncomplete(end)
        chunk = self.data[self.at : end]
        self.at = end
        return chunk

    def number(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.number("<Q")).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.number(_SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            return self.array()
        raise ValueError(f"not a GGUF header: a metadata value of type {kind}")

    def array(self) -> list[Any] | None:
        kind, count = self.number("<I"), self.number("<Q")
        if kind in _SCALARS and count > ARRAY_KEPT:  # stepped over at once
            self.take(count * struct.calcsize(_SCALARS[kind]))
            self.skipped = count
            return None
        values = [self.value(kind) for _ in range(count)]
        if count > ARRAY_KEPT:
            self.skipped = count
            return None
        return values


def read_header(data: bytes) -> GgufHeader:
    """The header at the start of `data`; HeaderIncomplete when `data` ends inside it,
    ValueError when it is no GGUF."""
    import gguf

    cursor = _Cursor(data)
    if cursor.take(4) != MAGIC:
        raise ValueError("not a GGUF file (no GGUF magic)")
    version = cursor.number("<I")
    if version not in (2, 3):
        raise ValueError(f"a GGUF version this reader does not know: {version}")
    tensor_count, kv_count = cursor.number("<Q"), cursor.number("<Q")
    metadata: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    for _ in range(kv_count):
        key = cursor.string()
        cursor.skipped = None
        metadata[key] = cursor.value(cursor.number("<I"))
        if metadata[key] is None and cursor.skipped is not None:
            lengths[key] = cursor.skipped
    tensors = []
    for _ in range(tensor_count):
        name = cursor.string()
        dims = [cursor.number("<Q") for _ in range(cursor.number("<I"))]
        kind = gguf.GGMLQuantizationType(cursor.number("<I"))
        cursor.number("<Q")  # its data's offset
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        elements = 1
        for dim in dims:
            elements *= dim
        tensors.append((name, elements * block_bytes // block))
    return GgufHeader(metadata, tuple(tensors), cursor.at, lengths)
