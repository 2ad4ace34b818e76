"""Which model fits, searched for (app.store.search): the loopback Hub
(tests/support/hub.py) answers the search as the Hub does; each GGUF repo found is planned
as `vramgate fits` plans it, from one header read with HTTP Ranges (the bytes the Hub sent
counted: headers, never weights), and its verdicts follow the machine's rooms."""

from __future__ import annotations

import pytest

from app.store.fits import fits
from app.store.machine import Machine
from app.store.search import format_search, search
from tests.support.hub import Hub

MiB, GiB = 2**20, 2**30
REPO = "Org/Smol-GGUF"
SMOL = "SmolLM2-135M-Instruct-Q4_1.gguf"
LARGER = "SmolLM2-135M-Instruct-Q8_0.gguf"  # listed, never fetched
BROKEN = "Org/Smol-Broken-GGUF"  # a .gguf file that is no GGUF


def gpu(free: int, most: int) -> Machine:
    return Machine("Simulated", True, free, most, 8 * GiB, 16 * GiB)


@pytest.fixture(scope="module")
def hub(smollm2_gguf):
    smol = smollm2_gguf.read_bytes()
    with Hub() as hub:
        hub.add(REPO, {SMOL: smol, LARGER: b"\0" * (len(smol) * 3 // 2), "README.md": b"#\n"})
        hub.add(BROKEN, {"smol-Q4_0.gguf": b"not a gguf" * 100})
        hub.add("Org/Smol-safetensors", {"model.safetensors": b"\0" * 64})  # no GGUF
        hub.add("Org/Other-GGUF", {"other-Q4_0.gguf": b"\0" * 64})  # another name
        yield hub


@pytest.fixture
def endpoint(hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", hub.url)  # as HF_ENDPOINT sets it
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub.reset()
    return hub


def test_a_search_plans_each_gguf_repo_found_from_its_header_only(endpoint):
    """The search finds the two GGUF repos named `smol` (most downloaded first), not the
    safetensors one nor another name; SmolLM2's repo is planned exactly as `fits` plans it
    (the planner whose answer the real load is compared with: tests/api/test_admin_fits),
    from its Q4_1's header: 2 MiB at most of its 98 MB, nothing of the Q8_0."""
    found = search("SMOL", gpu(4 * GiB, 8 * GiB), context=2048)
    assert [f.repo for f in found] == [REPO, BROKEN]
    smol, broken = found
    assert smol.fits is not None and smol.error is None and broken.fits is None
    assert broken.error is not None and "GGUF" in broken.error  # why it cannot be planned
    assert [(q.label, q.from_header) for q in smol.fits.quants] == [
        ("Q4_1", True), ("Q8_0", False),
    ]  # fmt: skip
    assert smol.fits.quant("Q4_1").now.verdict == "gpu"
    fetched = endpoint.sent[f"{REPO}/{SMOL}"]
    assert fetched == smol.fits.header_bytes <= 2 * MiB
    assert f"{REPO}/{LARGER}" not in endpoint.sent
    assert sum(endpoint.sent.values()) <= fetched + 1000  # the broken repo's 1000 bytes
    endpoint.reset()
    alone = fits(f"hf:{REPO}", gpu(4 * GiB, 8 * GiB), context=2048)
    assert alone == smol.fits  # one code path


def test_the_verdicts_follow_the_machines_free_memory(endpoint):
    roomy = search("smol", gpu(4 * GiB, 8 * GiB), context=2048, limit=1)
    tight = search("smol", gpu(100 * MiB, 8 * GiB), context=2048, limit=1)
    assert len(roomy) == len(tight) == 1  # the limit: one repo, one header
    now = tight[0].fits.quant("Q4_1").now  # type: ignore[union-attr]
    assert roomy[0].fits.quant("Q4_1").now.verdict == "gpu"  # type: ignore[union-attr]
    assert now.verdict == "split" and now.gpu_layers < now.layers == 30
    assert tight[0].fits.quant("Q4_1").most.verdict == "gpu"  # type: ignore[union-attr]


def test_the_answer_reads_in_words(endpoint):
    found = search("smol", gpu(100 * MiB, 8 * GiB), context=2048)
    said = format_search({"query": "smol", "results": [f.as_dict() for f in found]})
    assert said.startswith("on Simulated: 0.10 GiB free for a model now, 8.00 GiB at most")
    assert f"hf:{REPO} (3 downloads)" in said and "* Q4_1" in said
    assert "layers on the CPU" in said and "(scaled by file size)" in said
    assert f"hf:{BROKEN} (1 downloads)\n  cannot be planned: " in said
    assert "matches 'llama'" in format_search({"query": "llama", "results": []})


def test_vramgate_search_with_no_server_measures_this_machine(endpoint, tmp_path, capsys):
    """No server answers at the config's address: the command plans against this
    machine (its CPU here), measured by itself."""
    from app.cli import main

    config = tmp_path / "config.toml"
    config.write_text('device = "cpu"\nport = 9\n')  # nothing listens on port 9
    assert main(["search", "smol", "--limit", "1", "--config", str(config)]) == 0
    said = capsys.readouterr().out
    assert said.startswith("on ") and "CPU: " in said.splitlines()[0]
    assert f"hf:{REPO} (3 downloads)" in said
    assert "* Q4_1" in said and "fits in RAM (the CPU)" in said
    assert set(endpoint.sent) == {f"{REPO}/{SMOL}"}  # one repo: one header
