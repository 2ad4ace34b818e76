"""The CPU's dtype for generation: the faster of float32 and bfloat16, measured at load."""

from __future__ import annotations

import pytest
import torch

from app.engines.torch.generation.cpu_dtype import faster_dtype, interleaved_seconds


@pytest.mark.parametrize(
    ("seconds", "chosen"),
    [
        ({"float32": 0.042, "bfloat16": 0.027}, "bfloat16"),  # measured on SmolLM2 here
        ({"float32": 0.030, "bfloat16": 0.027}, "float32"),  # faster, but not by the margin
        ({"float32": 0.010, "bfloat16": 0.120}, "float32"),  # a CPU that emulates bfloat16
        ({"float32": 0.010}, "float32"),  # no copy could be tried
        ({"float32": 0.010, "bfloat16": 0.0}, "float32"),
    ],
)
def test_bfloat16_only_by_a_clear_margin(seconds, chosen):
    assert faster_dtype(seconds) == chosen


def test_the_two_dtypes_steps_are_timed_in_turns_and_the_first_two_rounds_left_out():
    """In turns, so that a burst of other work on the machine falls on both; the steps
    here return set durations (no clock read), the medians are of rounds 3 on."""
    order: list[str] = []
    durations = {"float32": iter([9.0, 9.0, 0.5, 0.4, 0.6]), "bfloat16": iter([9.0, 9.0, 1, 2, 3])}

    def step(name: str):
        def run() -> float:
            order.append(name)
            return next(durations[name])

        return run

    seconds = interleaved_seconds({name: step(name) for name in durations}, rounds=3)
    assert order == ["float32", "bfloat16"] * 5
    assert seconds == {"float32": 0.5, "bfloat16": 2.0}


def test_a_loaded_model_is_in_the_dtype_it_says(tmp_path):
    from app.config.settings import ModelSpec
    from app.devices.cpu import CpuDevice
    from app.engines.torch.generation.causal_lm import CausalLMHandler
    from tests.support.random_models import save_random_llama

    folder = save_random_llama(tmp_path / "tiny", context=128)
    handler = CausalLMHandler(ModelSpec(name="tiny", kind="generation", path=folder))
    handler.load(CpuDevice())
    try:
        assert handler.dtype in ("float32", "bfloat16")
        dtypes = {p.dtype for p in handler.torch_module().parameters()}
        assert dtypes == {getattr(torch, handler.dtype)}
    finally:
        handler.unload()
