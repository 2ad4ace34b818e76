"""A llama.cpp runner's load in phases (app.engines.llama_cpp.load.phases), read from
the engine's log as xllamacpp writes it here; and SmolLM2's real load on the CPU, its
phases said in the log as the runner reaches them."""

from __future__ import annotations

import logging
import threading

import httpx
import pytest

from app.config.settings import ModelSpec
from app.engines.llama_cpp.load.phases import PHASES, phase_of
from tests.support.live import live_server, make_settings

# lines of SmolLM2's load as the runner logged it here (timestamps as xllamacpp writes them)
LOG = [
    "0.00.005.336 I srv          init: loading model",
    "0.00.006.559 I srv    load_model: loading model '/tmp/SmolLM2-135M-Instruct.Q4_1.gguf'",
    "0.00.432.547 I load_tensors: loading model tensors, this can take a while... (mmap)",
    "0.00.435.881 I load_tensors:   CPU_Mapped model buffer size =    92.10 MiB",
    "0.00.439.093 I llama_context: constructing llama_context",
    "0.00.439.368 I llama_kv_cache:        CPU KV buffer size =    45.00 MiB",
    "0.00.487.736 I sched_reserve: reserving ...",
    "0.00.501.691 I cmn  common_init_: warming up the model with an empty run - please wait ...",
    "0.00.950.728 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 512",
]


@pytest.mark.parametrize(
    ("lines", "reached"),
    [
        (0, (1, "starting the runner")),
        (1, (1, "starting the runner")),  # the server's own start, no model yet
        (2, (2, "reading the model's header")),
        (4, (3, "loading the weights")),
        (6, (4, "allocating the KV cache")),
        (7, (5, "reserving compute buffers")),
        (8, (6, "warming up")),
        (9, (7, "starting its slots")),
    ],
)
def test_each_phase_begins_at_its_log_line(lines, reached):
    assert phase_of(LOG[:lines]) == reached


def test_a_phase_is_never_gone_back_to():
    assert phase_of([*LOG, "0.01 I srv    load_model: loading model again"])[0] == len(PHASES)


@pytest.mark.slow  # SmolLM2's real runner
def test_a_runners_load_says_its_phases_in_the_log(smollm2_gguf, tmp_path, caplog):
    caplog.set_level(logging.INFO, "vramgate.registry")
    spec = ModelSpec(
        name="smol", kind="generation", path=smollm2_gguf, context_length=2048, load="demand"
    )
    settings = make_settings(tmp_path, device="cpu", models=(spec,))
    with live_server(settings) as live:
        loading = threading.Thread(
            target=httpx.post, args=(live.url + "/admin/models/smol/load",), kwargs={"timeout": 300}
        )
        loading.start()
        loading.join(300)
        assert live.status()["models"][0]["state"] == "ready"
    said = [
        r.getMessage().removeprefix("model smol loading: ")
        for r in caplog.records
        if r.getMessage().startswith("model smol loading: ")
    ]
    names = [phase for _, phase in PHASES]
    steps = [names.index(line.split(" (")[0]) for line in said]
    assert steps and steps == sorted(steps), said  # phases as they began, in their order
    assert all(f"of {len(PHASES)})" in line for line in said), said
