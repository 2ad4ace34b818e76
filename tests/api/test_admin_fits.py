"""GET /admin/models/fits and a pull refused before its download, over HTTP on a live
server, the Hub on loopback (tests/support/hub.py) holding SmolLM2's real GGUF: the
verdicts follow the simulated device's free memory, a pull that could fit nowhere is a
413 with its numbers (the Ollama client's too) and only the header came, `force` pulls
it anyway; and on the CPU the answer is what the real load of the same file measures,
SmolLM2's and a Gemma 3's made here whose layers attend to a sliding window."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ollama import Client, ResponseError

from app.config.settings import ConfigSource, ModelSpec
from app.store import machine as machine_module
from tests.support.hub import Hub
from tests.support.live import live_server, make_settings
from tests.support.random_models import save_random_gemma3_gguf

MiB = 2**20
REPO = "Org/Smol-GGUF"
SMOL = "SmolLM2-135M-Instruct-Q4_1.gguf"


@pytest.fixture
def hub(smollm2_gguf, monkeypatch) -> Iterator[Hub]:
    from huggingface_hub import constants

    with Hub() as hub:
        hub.add(REPO, {SMOL: smollm2_gguf.read_bytes()})
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)  # as HF_ENDPOINT sets it
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        yield hub


def pulling_server(tmp_path: Path, device: str) -> tuple[ConfigSource, object]:
    config = tmp_path / "config.toml"
    config.write_text('[[models]]\nname = "sim"\nkind = "simulated"\nload = "startup"\n')
    source = ConfigSource(config, {"device": device, "models_dir": tmp_path / "models"})
    settings = make_settings(tmp_path, device=device, models=source.settings().models)
    return source, settings


def test_the_verdicts_follow_the_devices_free_memory(hub, tmp_path):
    source, settings = pulling_server(tmp_path, "simulated:256MiB")
    with live_server(settings, models_source=source) as live:
        asked = {"source": f"hf:{REPO}", "context": 2048}
        first = httpx.get(live.url + "/admin/models/fits", params=asked, timeout=60).json()
        assert first["chosen"] == "Q4_1" and first["repo"] == REPO
        fit = first["quants"][0]
        assert (fit["now"]["verdict"], fit["most"]["verdict"]) == ("gpu", "gpu")
        assert first["said"]["Q4_1"]["now"].startswith("fits on the GPU, 2048 tokens")
        assert first["header_bytes"] == hub.sent[f"{REPO}/{SMOL}"] <= 2 * MiB
        # another program takes 100 MiB: what is left holds some layers, beside the
        # compute buffer and the 90 MiB its drafts' logits add to it at 32 slots
        live.service.device.set_external(100 * MiB)
        taken = httpx.get(live.url + "/admin/models/fits", params=asked, timeout=60).json()
        now = taken["quants"][0]["now"]
        assert now["verdict"] == "split" and 0 < now["gpu_layers"] < now["layers"] == 30
        assert now["room_bytes"] < first["quants"][0]["now"]["room_bytes"] - 95 * MiB
        assert taken["quants"][0]["most"]["verdict"] == "gpu"
        missing = httpx.get(live.url + "/admin/models/fits", params={"source": "llama9"})
        assert missing.status_code == 404 and "llama3.2" in missing.json()["error"]["message"]


def test_a_pull_that_could_fit_nowhere_is_a_413_before_its_download(hub, tmp_path, monkeypatch):
    """A 64 MiB device beside 32 MiB of RAM (the reading patched: this machine has more):
    SmolLM2 needs 155 MiB at the least. Ollama's client gets the 413 and its numbers; the
    Hub sent its header only; `force` pulls it anyway."""
    monkeypatch.setattr(machine_module, "host_memory", lambda: (16 * MiB, 32 * MiB))
    source, settings = pulling_server(tmp_path, "simulated:64MiB")
    with live_server(settings, models_source=source) as live:
        with pytest.raises(ResponseError) as refused:
            Client(host=live.url).pull(f"hf.co/{REPO}")
        assert refused.value.status_code == 413
        said = refused.value.error
        assert "cannot fit on this machine at all" in said and "--force" in said
        assert "0.06 GiB (67108864 bytes) on Simulated" in said  # the most it has
        assert set(hub.sent) == {f"{REPO}/{SMOL}"} and hub.sent[f"{REPO}/{SMOL}"] <= 2 * MiB
        assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())
        hub.reset()
        body = {"source": f"hf:{REPO}", "force": True}
        with httpx.stream("POST", live.url + "/admin/models/pull", json=body, timeout=120) as r:
            last = [line for line in r.iter_lines() if line][-1]
        assert '"status": "success"' in last, last
        assert hub.sent[f"{REPO}/{SMOL}"] == len(hub.repos[REPO][SMOL])


@pytest.mark.slow  # a real llama.cpp load of SmolLM2
def test_the_answer_is_what_the_real_load_measures(hub, smollm2_gguf, tmp_path):
    """On the CPU, the bytes the answer plans for SmolLM2 at a 2,048 context (weights, its
    KV pool, compute buffers) against the same file loaded by llama.cpp with the same
    context: its pool's cells the same, its bytes (what the engine's log reported
    allocating) within 10%."""
    spec = ModelSpec(
        name="smol", kind="generation", path=smollm2_gguf, context_length=2048, load="startup"
    )
    settings = make_settings(tmp_path, device="cpu", models=(spec,))
    with live_server(settings) as live:
        asked = {"source": f"hf:{REPO}", "context": 2048}
        answer = httpx.get(live.url + "/admin/models/fits", params=asked, timeout=60).json()
        planned = answer["quants"][0]["now"]
        row = next(m for m in live.status()["models"] if m["name"] == "smol")
    measured = row["measured"]["device_bytes"] + row["measured"]["host_bytes"]
    assert planned["verdict"] == "cpu" and planned["kv_cells"] == row["kv_cells"]
    assert abs(planned["device_bytes"] - measured) <= 0.10 * measured, (planned, measured)


GEMMA_REPO = "Org/Gemma3-Random-GGUF"
GEMMA = "random-gemma3-F16.gguf"
WINDOW = 64
GEMMA_CONTEXT = 8192


@pytest.mark.slow  # a real llama.cpp load of a random Gemma 3
def test_a_sliding_window_models_answer_is_what_its_real_load_measures(tmp_path, monkeypatch):
    """A Gemma 3 made here (5 of its 6 layers attend to a window of 64 tokens) served by
    the loopback Hub, asked at an 8,192 context: a pool of 32,768 cells in 32 slots,
    where llama.cpp gives the sliding layers 64 x 32 + 512 = 2,560 cells each. The fits
    and search answers plan its KV at exactly what the load's log reports allocating,
    and all its bytes within 10% of what the load measured (266,946,560 planned against
    266,838,015 here; every layer at the pool's cells would be 4.3 times its KV and 3.3
    times its bytes, and without the attention masks' 34.5 MiB of compute buffer it was
    13.5% short)."""
    from huggingface_hub import constants

    gemma = save_random_gemma3_gguf(tmp_path / GEMMA, window=WINDOW, context=GEMMA_CONTEXT)
    spec = ModelSpec(
        name="gemma", kind="generation", path=gemma, context_length=GEMMA_CONTEXT, load="startup"
    )
    settings = make_settings(tmp_path, device="cpu", models=(spec,))
    with Hub() as hub, live_server(settings) as live:
        hub.add(GEMMA_REPO, {GEMMA: gemma.read_bytes()})
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)  # as HF_ENDPOINT sets it
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        asked = {"source": f"hf:{GEMMA_REPO}", "context": GEMMA_CONTEXT}
        answer = httpx.get(live.url + "/admin/models/fits", params=asked, timeout=60).json()
        found = {"q": "gemma3", "context": GEMMA_CONTEXT}
        searched = httpx.get(live.url + "/admin/models/search", params=found, timeout=60).json()
        row = next(m for m in live.status()["models"] if m["name"] == "gemma")
        assert hub.sent[f"{GEMMA_REPO}/{GEMMA}"] < len(gemma.read_bytes()) // 4  # its header
    planned = answer["quants"][0]["now"]
    also = searched["results"][0]["fits"]["quants"][0]["now"]
    assert (also["device_bytes"], also["kv_bytes"]) == (
        planned["device_bytes"],
        planned["kv_bytes"],
    )
    measured = row["measured"]["device_bytes"] + row["measured"]["host_bytes"]
    print(f"planned {planned}, measured {measured}: {row['measured']}")
    assert planned["verdict"] == "cpu" and planned["kv_cells"] == row["kv_cells"] == 32768
    assert abs(planned["device_bytes"] - measured) <= 0.10 * measured, (planned, measured)
    assert planned["kv_bytes"] == row["measured"]["host"]["KV"]
