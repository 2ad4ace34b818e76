"""The CPU's dtype for generation: the faster of float32 and bfloat16, measured at load."""

from __future__ import annotations

import pytest
import torch

from app.engines.torch.generation.cpu_dtype import faster_dtype


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
