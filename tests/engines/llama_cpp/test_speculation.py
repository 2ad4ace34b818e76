"""Speculative decoding on llama.cpp's engine, a model's side without a runner: the
plan a spec gives (on by default, off where `speculative = false`, sizes settable), the
runner settings and llama.cpp's parameters it becomes, and a model whose drafts are
rarely accepted turning it off by itself; a draft model's runner settings and bytes in
the load's plan. The real runner's side (on in /status and
/metrics, usage, greedy answers equal to llama.cpp's without it) is in test_generation;
the meter's verdicts in test_draft_meter."""

from __future__ import annotations

import logging

import pytest

from app.config.settings import ModelSpec
from app.engines.gguf_facts import read_gguf_facts
from app.engines.llama_cpp.draft_meter import MIN_DRAFTED
from app.engines.llama_cpp.generation import DraftRefused, LlamaCppHandler
from app.engines.llama_cpp.kv_pool import KvPool
from app.engines.llama_cpp.layer_split import LayerSplit
from app.engines.llama_cpp.load.plan import split_for
from app.engines.llama_cpp.process import Footprint
from app.engines.llama_cpp.runner_main import params_of
from app.engines.llama_cpp.speculation import (
    DRAFT_MAX,
    DRAFT_MIN,
    DRAFT_MODEL_KIND,
    DRAFT_MODEL_MAX,
    DRAFT_MODEL_MIN,
    KIND,
    NGRAM_MOD_POOL,
    draft_model_bytes,
    plan_speculation,
)


@pytest.fixture(scope="module")
def smol_facts(smollm2_gguf):
    """The GGUF's header, read once for the module (seconds on a busy machine)."""
    return read_gguf_facts(smollm2_gguf)


@pytest.fixture
def model_of(smollm2_gguf, smol_facts):
    """A handler of the SmolLM2 GGUF with the spec's `fields`."""

    def make(**fields) -> LlamaCppHandler:
        model = LlamaCppHandler(spec(smollm2_gguf, **fields))
        model._facts = smol_facts
        return model

    return make


def spec(gguf, **fields) -> ModelSpec:
    return ModelSpec(name="smol", kind="generation", path=gguf, **fields)


def next_runner(model: LlamaCppHandler) -> dict:
    """The settings its next runner starts with (a small pool on the CPU)."""
    return model.runner_config(KvPool(1024, 1024, 1), LayerSplit(30, 0, 0, False))


def test_a_gguf_with_no_settings_speculates_with_the_measured_kind(model_of):
    model = model_of()
    settings = next_runner(model)["speculative"]
    assert settings["kind"] == KIND == "ngram-mod"
    assert (settings["draft_min"], settings["draft_max"]) == (DRAFT_MIN, DRAFT_MAX)
    view = model.speculative_view()
    assert view["on"] is True and view["kind"] == KIND and view["pays"] is True
    # llama.cpp's own parameters, as the runner builds them
    params = params_of({**next_runner(model), "key": "k"})
    assert [t.name for t in params.speculative.types] == ["COMMON_SPECULATIVE_TYPE_NGRAM_MOD"]
    mod = params.speculative.ngram_mod
    assert (mod.n_min, mod.n_max) == (DRAFT_MIN, DRAFT_MAX)


def test_speculative_false_holds(model_of):
    model = model_of(speculative=False)
    assert "speculative" not in next_runner(model)
    params = params_of({**next_runner(model), "key": "k"})
    assert [t.name for t in params.speculative.types] == ["COMMON_SPECULATIVE_TYPE_NONE"]
    view = model.speculative_view()
    assert view["on"] is False and view["kind"] is None and view["why"] == "speculative = false"
    # measurements cannot turn it on
    loaded(model)._measure_drafts(final(drafted=64, accepted=64), streams=1)
    assert "speculative" not in next_runner(model) and model.meter.requests == 0


def test_draft_sizes_are_settable(model_of, smollm2_gguf):
    settings = next_runner(model_of(draft_min=2, draft_max=6))
    assert (settings["speculative"]["draft_min"], settings["speculative"]["draft_max"]) == (2, 6)
    # a fewest above the most takes the most
    plan = plan_speculation(spec(smollm2_gguf, draft_min=40, draft_max=16))
    assert plan is not None and (plan.draft_min, plan.draft_max) == (16, 16)


def loaded(model: LlamaCppHandler) -> LlamaCppHandler:
    """`model` as its runner serves it (no process: the handler's side only)."""
    model.pool = KvPool(1024, 1024, 1)
    model.speculating = model.planned_speculation()
    return model


def final(drafted: int, accepted: int, tokens: int = 96, ms: float = 1000.0) -> dict:
    """A completion's last event as llama.cpp sends it from a speculating runner."""
    timings = {"predicted_n": tokens, "predicted_ms": ms, "draft_n": drafted}
    return {"stop": True, "timings": {**timings, "draft_n_accepted": accepted}}


def test_a_model_whose_drafts_are_rarely_accepted_turns_it_off_by_itself(model_of, caplog):
    model = loaded(model_of())
    for _ in range(MIN_DRAFTED // 32):
        assert model.turned_off is None  # measuring: too few drafts to judge
        model._measure_drafts(final(drafted=32, accepted=2), streams=1)
    assert model.turned_off is not None and "rarely accepted" in model.turned_off.why
    assert "off from its next load" in caplog.text
    view = model.speculative_view()
    assert view["on"] is True and view["off_from_next_load"] is True and view["pays"] is False
    assert view["acceptance"] == round(2 / 32, 3)
    # its next runner does not speculate, and says so once loaded
    assert "speculative" not in next_runner(model)
    assert loaded(model).speculating is None and model.speculative_view()["on"] is False


def test_a_model_whose_drafts_are_accepted_keeps_it(model_of):
    model = loaded(model_of())
    for _ in range(40):
        model._measure_drafts(final(drafted=32, accepted=28), streams=1)
    assert model.turned_off is None and next_runner(model)["speculative"]["kind"] == KIND


def test_requests_that_drafted_nothing_are_measured_and_their_speed_can_turn_it_off(model_of):
    """llama.cpp says `draft_n` only where a request drafted (result_timings::to_json:
    `if (draft_n > 0)`): a free text that found no n-gram says nothing, and is the
    meter's measure of the runner without drafts. Drafting requests at half its speed,
    though their drafts are accepted, turn speculation off."""
    model = loaded(model_of())
    nothing = {"stop": True, "timings": {"predicted_n": 96, "predicted_ms": 960.0}}
    model._measure_drafts(nothing, streams=1)
    assert model.meter.requests == 1 and model.meter.recent[-1].drafted == 0
    for _ in range(8):
        model._measure_drafts(nothing, streams=1)
        model._measure_drafts(final(drafted=40, accepted=30, ms=1920.0), streams=1)
    assert model.turned_off is not None and "did not" in model.turned_off.why
    assert "speculative" not in next_runner(model)


def test_a_draft_model_drafts_in_its_runner_with_its_layers_where_the_models_are(
    model_of, smollm2_gguf, smol_facts
):
    model = model_of(draft=str(smollm2_gguf))  # a .gguf file: SmolLM2 as its own draft
    model._draft_facts = smol_facts
    settings = next_runner(model)["speculative"]  # on the CPU
    assert settings["kind"] == DRAFT_MODEL_KIND == "draft-simple"
    assert settings["model"] == str(smollm2_gguf) and settings["gpu_layers"] == 0
    assert (settings["draft_min"], settings["draft_max"]) == (DRAFT_MODEL_MIN, DRAFT_MODEL_MAX)
    pool = KvPool(1024, 1024, 1)
    some_on_gpu = model.runner_config(pool, LayerSplit(30, 12, 0, True))["speculative"]
    assert some_on_gpu["gpu_layers"] == smol_facts.layers + 1  # all of it, and its head
    assert model.runner_config(pool, LayerSplit(30, 0, 0, True))["speculative"]["gpu_layers"] == 0
    # llama.cpp's own parameters, as the runner builds them
    params = params_of({**next_runner(model), "key": "k"})
    assert [t.name for t in params.speculative.types] == ["COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE"]
    draft = params.speculative.draft
    assert draft.mparams.path == str(smollm2_gguf) and draft.n_gpu_layers == 0
    assert (draft.n_min, draft.n_max) == (DRAFT_MODEL_MIN, DRAFT_MODEL_MAX)
    assert draft.cache_type_k == draft.cache_type_v == params.cache_type_k
    view = model.speculative_view()
    assert view["on"] and view["draft_model"] == f"{smollm2_gguf}, named by its config's `draft`"
    assert model_of().speculative_view()["draft_model"] is None


def test_a_draft_models_bytes_are_planned_where_the_models_layers_are(model_of, smol_facts):
    """With the same draft sizes, a draft model adds its own bytes to the load's plan
    (less the n-gram pool, in host memory, that drafts without it keep), on the device
    where the model's layers are: on a GPU too small for both, fewer of them fit."""
    cells, slots = 8192, 4
    drafted = model_of(draft="/d/smol-draft.gguf", parallel=slots)
    drafted._draft_facts = smol_facts
    plain = model_of(draft_min=DRAFT_MODEL_MIN, draft_max=DRAFT_MODEL_MAX, parallel=slots)
    draft = draft_model_bytes(smol_facts, "f16", cells, slots)
    # 92.1 MiB of weights, 180 MiB of KV at 8,192 cells, 26.0 + 0.75 MiB of buffers
    assert round(draft / 2**20, 2) == 298.85

    def split(model: LlamaCppHandler, accelerator: bool, free: int | None = None) -> LayerSplit:
        return split_for(
            smol_facts, model.load_settings(), cells, accelerator=accelerator, free_bytes=free
        )

    gpu = split(drafted, True).device_bytes - split(plain, True).device_bytes
    assert gpu == draft
    cpu = split(drafted, False).device_bytes - split(plain, False).device_bytes
    assert cpu == draft - NGRAM_MOD_POOL
    room = split(plain, True).device_bytes + draft // 2  # the model alone, and more
    assert split(plain, True, room).on_device == 30 > split(drafted, True, room).on_device > 0


def test_the_load_says_which_draft_was_paired_and_fails_where_llama_cpp_refused_it(
    model_of, smollm2_gguf, smol_facts, caplog
):
    caplog.set_level(logging.INFO, logger="vramgate.llama_cpp")
    model = model_of(draft=str(smollm2_gguf))
    model.loaded({"chat_template": "{{ messages }}"})  # its runner logged no refusal
    said = f"draft-simple with the draft model {smollm2_gguf}, named by its config's `draft`"
    assert said in caplog.text and model.speculating is not None
    # llama.cpp's reason, as its log said it for a draft of another vocabulary
    refused = "draft model vocab type must match target model to use speculation"
    model._footprint = Footprint({}, {}, speculation_failed=refused)
    with pytest.raises(DraftRefused, match=refused):
        model.loaded({"chat_template": "{{ messages }}"})
    plain = model_of()  # drafting without a draft model, nothing to pair
    plain._footprint = Footprint({}, {}, speculation_failed=refused)
    plain.loaded({"chat_template": "{{ messages }}"})
