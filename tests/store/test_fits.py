"""Which quantisation fits, before the download (app.store.fits): verdicts from the load
planner against rooms of a machine, each quantisation of a repo of the loopback Hub
(tests/support/hub.py) planned from one header read with HTTP Ranges (the bytes the Hub
sent counted: the header's, never the weights), and a pull that could fit nowhere refused
as the listing or the header says."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engines.gguf_facts import GgufFacts, read_gguf_facts
from app.engines.llama_cpp.load.plan import LoadSettings
from app.store import fits as fits_module
from app.store.fits import fits, place, pull_refusal, scaled
from app.store.machine import Machine
from tests.support.hub import Hub

MiB, GiB = 2**20, 2**30
REPO = "Org/Smol-GGUF"
SMOL = "SmolLM2-135M-Instruct-Q4_1.gguf"
LARGER = "SmolLM2-135M-Instruct-Q8_0.gguf"  # listed, never fetched: its size says enough


def model(layers: int = 10, layer_mib: int = 100, head_mib: int = 50) -> GgufFacts:
    """A model of `layers` blocks of `layer_mib`, a 2k context, 8 KiB of KV a token."""
    return GgufFacts(
        architecture="llama",
        layers=layers,
        context_length=2048,
        width=1024,
        kv_width=256,  # 2 bytes each at f16: 512 B a token a layer
        layer_bytes=(layer_mib * MiB,) * layers,
        other_bytes=head_mib * MiB,
        chat_template=None,
        file_bytes=(layers * layer_mib + head_mib) * MiB + MiB,
    )


def gpu(free: int, most: int, host_free: int = 8 * GiB, host_total: int = 16 * GiB) -> Machine:
    return Machine("Simulated", True, free, most, host_free, host_total)


@pytest.mark.parametrize(
    ("free", "verdict", "gpu_layers"),
    [
        (4 * GiB, "gpu", 10),  # room for all: the whole model and its pool
        (700 * MiB, "split", 6),  # 6 layers, their KV and 32 MiB of compute: 638 MiB
        (10 * MiB, "split", 0),  # no layer's room: all of it in RAM
    ],
)
def test_a_placement_follows_the_planner_as_the_room_changes(free, verdict, gpu_layers):
    placed = place(model(), LoadSettings(), gpu(free, 8 * GiB), free, 8 * GiB)
    assert (placed.verdict, placed.gpu_layers, placed.layers) == (verdict, gpu_layers, 10)
    assert placed.context == 2048  # the pool shrinks to its floor before a layer moves
    if verdict == "split":
        on_cpu = 10 - gpu_layers
        kv = on_cpu * 512 * placed.kv_cells
        assert placed.host_bytes >= on_cpu * 100 * MiB + 50 * MiB + kv


def test_a_split_whose_cpu_layers_need_more_ram_than_there_is_does_not_fit():
    placed = place(model(), LoadSettings(), gpu(700 * MiB, GiB), 700 * MiB, 400 * MiB)
    assert placed.verdict == "no" and placed.host_bytes > 400 * MiB
    cpu = Machine("CPU", False, GiB, GiB, GiB, GiB)
    assert place(model(), LoadSettings(), cpu, GiB, GiB).verdict == "no"  # 1.05 GiB of weights
    assert place(model(layers=4), LoadSettings(), cpu, GiB, GiB).verdict == "cpu"


def test_another_quantisation_is_scaled_by_its_file_size_less_the_header():
    facts = model()
    larger = scaled(facts, 2 * (facts.file_bytes - MiB) + MiB, "Q8_0")
    assert larger.layer_bytes == (200 * MiB,) * 10 and larger.other_bytes == 100 * MiB
    assert larger.quantization == "Q8_0" and larger.kv_width == facts.kv_width


@pytest.fixture(scope="module")
def hub(smollm2_gguf):
    """SmolLM2's real GGUF as a repo's Q4_1, beside a Q8_0 listed at 1.5 times its size."""
    smol = smollm2_gguf.read_bytes()
    with Hub() as hub:
        hub.add(REPO, {SMOL: smol, LARGER: b"\0" * (len(smol) * 3 // 2), "README.md": b"#\n"})
        yield hub


@pytest.fixture
def endpoint(hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", hub.url)  # as HF_ENDPOINT sets it
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub.reset()
    return hub


def test_each_quantisation_is_planned_from_one_header_read_with_ranges(endpoint, smollm2_gguf):
    """Only the Q4_1's header comes (its first 2 MiB of 98 MB); its facts are those of the
    whole file read here; the Q8_0 is planned from its listed size alone."""
    found = fits(f"hf:{REPO}", gpu(4 * GiB, 8 * GiB), context=2048)
    assert found.chosen == "Q4_1"  # the repo has no Q4_K_M: the nearest
    assert [q.label for q in found.quants] == ["Q4_1", "Q8_0"]
    assert set(endpoint.sent) == {f"{REPO}/{SMOL}"}
    assert endpoint.sent[f"{REPO}/{SMOL}"] == found.header_bytes <= 2 * MiB
    assert all(r == f"bytes=0-{MiB - 1}" or r.startswith("bytes=") for _, r in endpoint.ranges)
    local = read_gguf_facts(smollm2_gguf)
    own, larger = found.quants
    assert own.from_header and own.weights_bytes == sum(local.layer_bytes) + local.other_bytes
    assert not larger.from_header and larger.weights_bytes > 1.4 * own.weights_bytes
    assert own.now.verdict == own.most.verdict == "gpu" and own.now.context == 2048
    assert own.kv_bytes_per_token == local.kv_bytes_per_token("f16")
    same = fits(str(smollm2_gguf), gpu(4 * GiB, 8 * GiB), context=2048).quants[0]
    assert (same.now, same.weights_bytes) == (own.now, own.weights_bytes)  # one planner


def test_the_verdicts_change_with_the_room(endpoint):
    roomy = fits(f"hf:{REPO}", gpu(4 * GiB, 8 * GiB), context=2048).quant("Q4_1")
    # 150 MiB: room for some layers beside the compute buffer and the 90 MiB that its
    # drafts' logits add to it at 32 slots (speculation is on for a model with no settings)
    tight = fits(f"hf:{REPO}", gpu(150 * MiB, 8 * GiB), context=2048).quant("Q4_1")
    assert roomy.now.verdict == "gpu" and tight.now.verdict == "split"
    assert 0 < tight.now.gpu_layers < tight.now.layers == 30
    assert tight.most.verdict == "gpu"  # with nothing else on the device it would fit


def test_a_pull_that_could_fit_nowhere_is_refused_from_the_listing_or_the_header(endpoint):
    small = Machine("Simulated 64 MiB", True, 64 * MiB, 64 * MiB, 16 * MiB, 32 * MiB)
    said = pull_refusal(f"hf:{REPO}:Q8_0", small)  # 147 MB of file against 96 MiB in all
    assert said is not None and "cannot fit on this machine at all" in said
    assert "its files alone are" in said and "--force" in said
    assert not endpoint.sent  # the listing said enough
    said = pull_refusal(f"hf:{REPO}", small)  # 98 MB: between half and all of it
    assert said is not None and "it needs" in said and "on the device and" in said
    assert set(endpoint.sent) == {f"{REPO}/{SMOL}"}
    assert endpoint.sent[f"{REPO}/{SMOL}"] <= 2 * MiB  # its header, not its weights
    endpoint.reset()
    roomy = Machine("Simulated", True, GiB, GiB, GiB, 2 * GiB)
    assert pull_refusal(f"hf:{REPO}", roomy) is None and not endpoint.sent  # half or less
    assert pull_refusal("pip:some-package", small) is None


def test_a_fits_answer_reads_back_from_its_json(endpoint):
    found = fits(f"hf:{REPO}", gpu(100 * MiB, GiB), context=2048)
    assert fits_module.Fits.of(found.as_dict()) == found
    table = fits_module.format_fits(found)
    assert "* Q4_1" in table and "layers on the CPU" in table and "fits on the GPU" in table


def test_a_source_that_is_no_gguf_is_said_so(tmp_path: Path):
    from app.store.sources import PullError

    (tmp_path / "folder").mkdir()
    with pytest.raises(PullError, match="fits plans GGUF models"):
        fits(str(tmp_path / "folder"), gpu(GiB, GiB))


def test_vramgate_fits_answers_on_the_command_line_with_no_server(hub, tmp_path):
    """No server answers at the config's address: this machine (its CPU here) is measured
    by the command itself."""
    import subprocess
    import sys

    from tests.support.live import clean_env

    hub.reset()
    config = tmp_path / "config.toml"
    config.write_text('device = "cpu"\nport = 9\n')  # nothing listens on port 9
    env = clean_env() | {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    command = [sys.executable, "-m", "app", "fits", f"hf:{REPO}", "--context", "2048"]
    done = subprocess.run(
        [*command, "--config", str(config)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"hf:{REPO} = {REPO}: on " in done.stdout and "GiB free for a model now" in done.stdout
    assert "* Q4_1" in done.stdout and "fits in RAM (the CPU), 2048 tokens a request" in done.stdout
    assert "Q8_0" in done.stdout and "(scaled by file size)" in done.stdout
    assert set(hub.sent) == {f"{REPO}/{SMOL}"}
