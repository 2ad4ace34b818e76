"""How many layers go to the GPU: all that fit, the rest on the CPU, said as Ollama says it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.engines.gguf_facts import GgufFacts
from app.engines.llama_cpp.layer_split import (
    bytes_on_device,
    compute_bytes,
    plan_split,
    speculation_bytes,
)

MiB, GiB = 2**20, 2**30


def facts(layers: int = 32, layer_mib: int = 40, other_mib: int = 200) -> GgufFacts:
    return GgufFacts(
        architecture="llama",
        layers=layers,
        context_length=8192,
        width=4096,
        kv_width=2 * 8 * 128,  # 8 KV heads of 128, K and V
        layer_bytes=(layer_mib * MiB,) * layers,
        other_bytes=other_mib * MiB,
        chat_template=None,
        file_bytes=(layers * layer_mib + other_mib) * MiB,
    )


def test_on_the_cpu_everything_is_in_ram_and_no_layer_is_offloaded():
    split = plan_split(facts(), kv_type="f16", cells=4096, accelerator=False, free_bytes=None)
    assert split.gpu_layers_arg == 0
    assert split.describe() == "100% CPU"
    kv = 4096 * 32 * 2 * 8 * 128 * 2
    compute = compute_bytes(facts(), 4096)  # activations, and the mask: 512 x 4096 x 2 bytes
    assert compute == 512 * 4096 * 4 * 16 + 4 * MiB
    assert split.device_bytes == 32 * 40 * MiB + 200 * MiB + kv + compute


def test_a_model_that_fits_goes_whole_with_its_output_head():
    split = plan_split(facts(), kv_type="f16", cells=4096, accelerator=True, free_bytes=8 * GiB)
    assert (split.on_device, split.gpu_layers_arg) == (32, 33)
    assert split.describe() == "100% GPU"


def test_a_model_needing_1_5_gib_on_1_gib_free_starts_with_the_layers_that_fit():
    model = facts(layers=30, layer_mib=30, other_mib=200)
    whole = bytes_on_device(model, 30, "f16", 2048)
    assert 1.4 * GiB < whole < 1.6 * GiB
    split = plan_split(model, kv_type="f16", cells=2048, accelerator=True, free_bytes=GiB)
    assert 0 < split.on_device < 30
    assert split.device_bytes <= GiB
    assert bytes_on_device(model, split.on_device + 1, "f16", 2048) > GiB  # no more fit
    gpu = round(100 * split.on_device / 30)
    assert split.describe() == f"{100 - gpu}%/{gpu}% CPU/GPU"
    assert split.gpu_layers_arg == split.on_device  # the head stays on the CPU


@pytest.mark.parametrize(("kv_type", "ratio"), [("f16", 1.0), ("q8_0", 34 / 64), ("q4_0", 18 / 64)])
def test_a_smaller_kv_type_prices_fewer_kv_bytes(kv_type, ratio):
    model = facts()
    assert model.kv_bytes_per_token(kv_type) == int(model.kv_bytes_per_token("f16") * ratio)


def test_layers_asked_for_are_taken_as_asked_and_nothing_fits_in_nothing():
    model = facts()
    asked = plan_split(
        model, kv_type="f16", cells=1024, accelerator=True, free_bytes=0, gpu_layers=5
    )
    assert asked.on_device == 5
    none = plan_split(model, kv_type="f16", cells=1024, accelerator=True, free_bytes=10 * MiB)
    assert (none.on_device, none.device_bytes, none.describe()) == (0, 0, "100% CPU")


def test_drafts_add_a_row_of_logits_per_drafted_token_to_the_compute_and_output_buffers():
    """SmolLM2-135M's vocabulary (49,152 tokens): 0.1875 MiB a row, as llama.cpp's log
    grew by (layer_split.speculation_bytes); a micro-batch of 512 rows at most."""
    smol = replace(facts(), vocab=49152)
    row = 49152 * 4
    assert speculation_bytes(smol, 4, 24) == (100 - 4) * row == 18 * MiB
    assert speculation_bytes(smol, 32, 24) == (512 - 32) * row == 90 * MiB
    assert speculation_bytes(smol, 32, 0) == 0 and speculation_bytes(facts(), 32, 24) == 0
    cpu = plan_split(smol, kv_type="f16", cells=4096, accelerator=False, free_bytes=None)
    drafting = plan_split(
        smol,
        kv_type="f16",
        cells=4096,
        accelerator=False,
        free_bytes=None,
        drafting=90 * MiB,
        drafting_host=106 * MiB,
    )
    assert drafting.device_bytes == cpu.device_bytes + 196 * MiB  # the CPU's RAM: all of it
    gpu = plan_split(smol, kv_type="f16", cells=4096, accelerator=True, free_bytes=None)
    on_gpu = plan_split(
        smol,
        kv_type="f16",
        cells=4096,
        accelerator=True,
        free_bytes=None,
        drafting=90 * MiB,
        drafting_host=106 * MiB,
    )
    assert on_gpu.device_bytes == gpu.device_bytes + 90 * MiB  # the pool and outputs: RAM
