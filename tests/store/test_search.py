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


TINY = "Org/Tiny-135M-GGUF"


def smallest_whole_room(facts) -> int:  # type: ignore[no-untyped-def]
    """The fewest bytes of device room in which the planner puts `facts` whole on a GPU."""
    from app.engines.llama_cpp.load.plan import LoadSettings
    from app.store.fits import place

    lo, hi = 0, 4 * GiB
    while hi - lo > MiB:
        mid = (lo + hi) // 2
        fits_whole = place(facts, LoadSettings(), gpu(mid, mid), mid, 8 * GiB).verdict == "gpu"
        lo, hi = (lo, mid) if fits_whole else (mid, hi)
    return hi


def test_a_names_size_pulls_the_largest_quantisation_that_fits_the_gpu_whole(
    hub, endpoint, smollm2_gguf, tmp_path
):
    """`tiny:135m` (a name of the config's own table, at Q8_0): on a GPU whose room fits
    the Q8_0 whole it stays Q8_0; on one between what the Q8_0 and a Q2_K a quarter its
    size need, the Q2_K; an explicit quantisation in the tag, or a CPU, keeps the table's."""
    from app.config import ollama_names
    from app.engines.gguf_facts import read_gguf_facts
    from app.store.fits import fitted_source, scaled
    from app.store.sources import parse_source

    smol = smollm2_gguf.read_bytes()
    hub.add(TINY, {"tiny-135m-Q8_0.gguf": smol, "tiny-135m-Q2_K.gguf": b"\0" * (len(smol) // 4)})
    names = tmp_path / "names.toml"
    names.write_text(
        f'[[names]]\nname = "tiny"\ndefault = "135m"\nquant = "Q8_0"\n'
        f'tags = {{ "135m" = "{TINY}" }}\n'
    )
    facts = read_gguf_facts(smollm2_gguf)
    q8 = smallest_whole_room(facts)
    q2 = smallest_whole_room(scaled(facts, len(smol) // 4, "Q2_K"))
    between = gpu((q8 + q2) // 2, (q8 + q2) // 2)
    ollama_names.use(names)
    try:
        source = parse_source("tiny:135m")
        picked, why = fitted_source(source, between)
        kept, none = fitted_source(source, gpu(q8 + 64 * MiB, q8 + 64 * MiB))
        named, _ = fitted_source(parse_source("tiny:135m-q8_0"), between)
        cpu = Machine("CPU", False, q2, q2, 8 * GiB, 16 * GiB)
        on_cpu, _ = fitted_source(source, cpu)
    finally:
        ollama_names.use(None)
    assert (picked.default_quant, picked.library) == ("Q2_K", source.library)
    assert why is not None and why.startswith(f"Q2_K: the largest quantisation of {TINY} ")
    assert "(Q8_0, the names table's, fits with " in why
    assert (kept, none) == (source, None) and named.quant == "Q8_0" and on_cpu == source
    assert q2 < q8 - 50 * MiB  # the rooms are apart: the test tells them apart
