"""What every handler shares: the fingerprint that names its weights in prices, and the
bytes a load will take, known before loading."""

from __future__ import annotations

import os

import pytest

from app.config.settings import ModelSpec
from app.devices.cpu import CpuDevice
from app.engines.torch.generation.causal_lm import CausalLMHandler
from app.models.base import weights_fingerprint
from tests.support.random_models import save_random_llama


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_random_llama(tmp_path_factory.mktemp("llama") / "tiny", context=64)


def test_the_fingerprint_changes_with_the_weights_or_the_config(llama):
    first = weights_fingerprint(llama)
    assert weights_fingerprint(llama) == first  # stable while nothing changes
    weights = llama / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # pull --force
    second = weights_fingerprint(llama)
    assert second != first
    config = llama / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps"', '"rms_norm_eps" '))
    os.utime(config, ns=(stat.st_atime_ns, config.stat().st_mtime_ns))  # same time, new text
    assert weights_fingerprint(llama) not in (first, second)


def test_a_handler_is_identified_by_its_folder(llama):
    handler = CausalLMHandler(ModelSpec(name="tiny", kind="generation", path=llama))
    assert handler.identify() == weights_fingerprint(llama)
    other = CausalLMHandler(ModelSpec(name="tiny", kind="generation", path=llama, dtype="float16"))
    assert other.identify() == handler.identify()  # the dtype is in the price key already


def test_a_load_is_priced_from_the_files_before_loading(llama):
    """save_random_llama saves float32: on the CPU (float32) a load takes the file's
    bytes; asked for float16, half of them."""
    size = (llama / "model.safetensors").stat().st_size
    spec = ModelSpec(name="tiny", kind="generation", path=llama)
    assert CausalLMHandler(spec).expected_weights_bytes(CpuDevice()) == size
    half = spec.model_copy(update={"dtype": "float16"})
    assert CausalLMHandler(half).expected_weights_bytes(CpuDevice()) == size // 2
    loaded = CausalLMHandler(spec)
    loaded.load(CpuDevice())
    assert abs(loaded.weights_bytes() - size) < 0.01 * size  # the estimate was right
