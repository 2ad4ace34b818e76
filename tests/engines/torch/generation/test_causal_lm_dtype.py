"""Which dtype a generation model loads in, and a model whose forward overflows in it.

float16 overflows where bfloat16 does not (its largest value is 65504): models trained
in bfloat16 (Gemma's config says so) produce inf and NaN logits in float16, `multinomial`
raises, and every request of the batch ends in a 500."""

from __future__ import annotations

import json

import pytest
import torch

from app.config.settings import ModelSpec
from app.devices.cpu import CpuDevice
from app.engines.torch.generation.causal_lm import CausalLMHandler
from tests.devices.test_devices import fake_cuda_device
from tests.support.random_models import save_random_llama


def _trained_in(folder, dtype: str):
    """The config as a model trained in `dtype` ships it (Gemma: bfloat16)."""
    config = json.loads((folder / "config.json").read_text())
    config.pop("dtype", None)
    config["torch_dtype"] = dtype  # the key older transformers wrote, as on the hub
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_bf16_trained_model_loads_in_float32_on_a_gpu_without_bf16(tmp_path):
    folder = _trained_in(save_random_llama(tmp_path / "gemma-like"), "bfloat16")
    handler = CausalLMHandler(ModelSpec(name="g", kind="generation", path=folder))
    device, stats = fake_cuda_device(0)
    stats.capability = (7, 5)  # Turing: float16, no native bfloat16
    turing = handler.expected_weights_bytes(device)
    stats.capability = (8, 6)  # Ampere: bfloat16 as trained
    ampere = handler.expected_weights_bytes(device)
    assert turing == 2 * ampere  # float32 (4 bytes) where float16 (2) would overflow

    plain = _trained_in(save_random_llama(tmp_path / "fp16-trained"), "float16")
    stats.capability = (7, 5)
    fp16 = CausalLMHandler(ModelSpec(name="f", kind="generation", path=plain))
    assert fp16.expected_weights_bytes(device) == ampere  # float16, as trained


def _overflowing(folder):
    """Weights whose logits are ~5e7: finite in float32, inf in float16."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.fill_(60000.0)
        model.model.norm.weight.fill_(100.0)
    model.save_pretrained(folder)
    return folder


def test_a_model_whose_first_forward_is_not_finite_is_refused_with_the_reason(tmp_path):
    folder = _overflowing(save_random_llama(tmp_path / "overflows"))
    half = CausalLMHandler(ModelSpec(name="h", kind="generation", path=folder, dtype="float16"))
    with pytest.raises(ValueError, match=r"not finite in float16.*float32"):
        half.load(CpuDevice())  # a real float16 forward on the CPU overflows
    whole = CausalLMHandler(ModelSpec(name="w", kind="generation", path=folder, dtype="float32"))
    whole.load(CpuDevice())
    whole.unload()
