"""The SmolLM2 GGUF served as the engine's tests need it: a spec whose runner's KV pool
is exactly a number of cells, on the defaults otherwise (its slots, a request's whole
context), for the tests that fill a pool in actual use; a live server of it with a
context and slots of the test's choosing; and the long answer the tests stop, kill or
overflow a runner in the middle of."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.config.settings import ModelSpec
from app.engines.gguf_facts import read_gguf_facts
from tests.support.live import Live, live_server, make_settings

STORY = [{"role": "user", "content": "Tell a very long story about a cat."}]


def long_story(max_tokens: int) -> dict[str, Any]:
    """A streamed, greedy chat of `smol` for STORY, up to `max_tokens`."""
    return {
        "model": "smol",
        "messages": STORY,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }


def pool_of(gguf: Path, cells: int, name: str = "smol") -> ModelSpec:
    """`gguf` served as `name`, loaded at start, its `kv_budget` bought `cells` f16 cells."""
    per_cell = read_gguf_facts(gguf).kv_bytes_per_token("f16")
    return ModelSpec(
        name=name, kind="generation", path=gguf, kv_budget=cells * per_cell, load="startup"
    )


@contextlib.contextmanager
def serving(gguf: Path, tmp: Path, context: int, parallel: int, **fields: Any) -> Iterator[Live]:
    """A live server of `gguf` as `smol` on the CPU, loaded at start, `parallel` slots of
    `context` tokens, and the spec's other `fields`; a queue that waits as long as a slow
    machine needs."""
    spec = ModelSpec(
        name="smol",
        kind="generation",
        path=gguf,
        context_length=context,
        parallel=parallel,
        load="startup",
        **fields,
    )
    settings = make_settings(tmp, device="cpu", models=(spec,), queue_timeout=900)
    with live_server(settings) as live:
        yield live
