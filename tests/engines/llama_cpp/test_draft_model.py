"""A draft model for speculative decoding, end to end: SmolLM2's GGUF served with a copy
of itself as its draft model (a model of the config named by its `draft`), by a real
runner: its bytes in the model's measured bytes and in the pool's, the pairing in
/status, greedy answers equal to those without it; a draft of another vocabulary
refused at load."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from app.config.settings import ModelSpec
from app.engines.gguf_facts import read_gguf_facts
from app.engines.llama_cpp.speculation import DRAFT_MODEL_KIND, draft_model_bytes
from tests.engines.llama_cpp.pools import STORY
from tests.support.live import Live, live_server, make_settings, wait_until
from tests.support.random_models import save_random_llama, save_random_llama_gguf

pytestmark = pytest.mark.slow

CONTEXT, PARALLEL = 512, 4
CELLS = CONTEXT * PARALLEL
# the same draft sizes with the draft model and without it (n-gram drafts): the model's
# own compute and output buffers are then the same, and only the draft model differs
SIZES = {"draft_min": 2, "draft_max": 4}
CHATS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog."}],
    STORY,
]


@pytest.fixture(scope="module")
def draft_copy(smollm2_gguf, tmp_path_factory) -> Path:
    """SmolLM2's GGUF under another name: a draft model of the same vocabulary."""
    copy = tmp_path_factory.mktemp("draft") / "smol-draft.gguf"
    shutil.copyfile(smollm2_gguf, copy)
    return copy


@contextlib.contextmanager
def serving(
    gguf: Path, draft_copy: Path, tmp: Path, ready: bool = True, **fields: Any
) -> Iterator[Live]:
    """`gguf` as `smol` on a simulated 4 GiB GPU (its runner on the CPU; the gate counts
    the load's planned bytes there), loaded at start, with the spec's `fields`; the
    draft copy served as `smol-draft` beside it, on demand."""
    spec = ModelSpec(
        name="smol",
        kind="generation",
        path=gguf,
        context_length=CONTEXT,
        parallel=PARALLEL,
        load="startup",
        **SIZES,
        **fields,
    )
    draft = ModelSpec(name="smol-draft", kind="generation", path=draft_copy)
    settings = make_settings(
        tmp, device="simulated:4GiB", reserve=0, models=(spec, draft), queue_timeout=900
    )
    with live_server(settings, ready=ready) as live:
        yield live


def row(live: Live) -> dict[str, Any]:
    return next(m for m in live.status()["models"] if m["name"] == "smol")


def answers(live: Live) -> list[str]:
    client = OpenAI(base_url=live.url + "/v1", api_key="unused")
    found = [
        client.chat.completions.create(model="smol", messages=chat, temperature=0, max_tokens=32)
        for chat in CHATS
    ]
    return [str(a.choices[0].message.content) for a in found]


def test_a_draft_models_bytes_are_in_the_measured_bytes_and_shrink_the_pool(
    smollm2_gguf, draft_copy, tmp_path
):
    """Two loads of the same model, with the draft model its config names and without
    (n-gram drafts of the same sizes): the runner's measured bytes (llama.cpp's log) grow
    by the draft's weights and KV (and its buffers; less the n-gram pool it no longer
    keeps), the bytes the gate counts (its planned split, on a simulated GPU) by what
    the plan says a draft model takes, and the pool shrinks by that; /status and the
    log say which draft was paired and why; the greedy answers are the same."""
    found: dict[bool, dict[str, Any]] = {}
    said: dict[bool, list[str]] = {}
    for paired in (False, True):
        fields = {"draft": "smol-draft"} if paired else {}
        with serving(smollm2_gguf, draft_copy, tmp_path / f"paired-{paired}", **fields) as live:
            found[paired] = row(live)
            assert found[paired]["state"] in ("ready", "warming"), found[paired]["error"]
            found[paired]["pool"] = live.status()["pool"]["pool_bytes"]
            said[paired] = answers(live)
            found[paired]["after"] = row(live)["speculative"]
    with_draft, without = found[True], found[False]

    facts = read_gguf_facts(draft_copy)
    weights_and_kv = sum(facts.layer_bytes) + facts.other_bytes
    weights_and_kv += facts.kv_bytes_per_token("f16") * CELLS
    measured = with_draft["measured"]["host_bytes"] - without["measured"]["host_bytes"]
    ngram_pool = without["measured"]["host"]["ngram"]  # 16 MiB, kept without a draft only
    assert "ngram" not in with_draft["measured"]["host"]
    # its compute and output buffers (16.64 and 0.75 MiB logged here) beside them
    assert weights_and_kv < measured + ngram_pool < weights_and_kv + 32 * 2**20

    planned = draft_model_bytes(facts, "f16", CELLS, PARALLEL)
    assert with_draft["weights_bytes"] - without["weights_bytes"] == planned
    assert without["pool"] - with_draft["pool"] == planned

    view = with_draft["speculative"]
    assert view["on"] and view["kind"] == DRAFT_MODEL_KIND == "draft-simple"
    assert view["draft_model"] == f"smol-draft ({draft_copy}), named by its config's `draft`"
    assert with_draft["after"]["drafted_tokens"] > 0 and with_draft["after"]["accepted_tokens"] > 0
    assert without["speculative"]["draft_model"] is None
    assert said[True] == said[False]


def test_a_draft_model_of_another_vocabulary_is_refused_at_load(smollm2_gguf, draft_copy, tmp_path):
    """llama.cpp alone would serve on without drafts, the draft model's memory taken for
    nothing: the load fails, saying why (llama.cpp's own words, common/speculative.cpp).
    The draft of the same vocabulary loads (the test above)."""
    other = save_random_llama_gguf(save_random_llama(tmp_path / "tiny"), tmp_path / "tiny.gguf")
    fields = {"draft": str(other)}
    with serving(smollm2_gguf, draft_copy, tmp_path / "refused", ready=False, **fields) as live:
        wait_until(lambda: row(live)["state"] == "failed", 200, "the load refused")
        found = row(live)
    assert found["state"] == "failed"
    assert "draft model vocab type must match target model to use speculation" in found["error"]
    assert "DraftRefused" in found["error"]
