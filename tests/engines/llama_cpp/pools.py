"""A GGUF model spec whose runner's KV pool is exactly a number of cells, on the
defaults otherwise (its slots, a request's whole context): shared by the tests that
fill a pool in actual use."""

from __future__ import annotations

from pathlib import Path

from app.config.settings import ModelSpec
from app.engines.gguf_facts import read_gguf_facts


def pool_of(gguf: Path, cells: int, name: str = "smol") -> ModelSpec:
    """`gguf` served as `name`, loaded at start, its `kv_budget` bought `cells` f16 cells."""
    per_cell = read_gguf_facts(gguf).kv_bytes_per_token("f16")
    return ModelSpec(
        name=name, kind="generation", path=gguf, kv_budget=cells * per_cell, load="startup"
    )
