"""GET /admin/models/search and `vramgate search` against a live server, the Hub on
loopback (tests/support/hub.py) holding SmolLM2's real GGUF: each quantisation's verdict
follows the simulated device's free memory, and only the header came."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.cli import main
from app.config.settings import ConfigSource, ModelSpec
from tests.support.hub import Hub
from tests.support.live import live_server, make_settings

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


def test_a_search_over_http_follows_the_simulated_devices_free_memory(hub, tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text('[[models]]\nname = "sim"\nkind = "simulated"\nload = "startup"\n')
    source = ConfigSource(config, {"device": "simulated:256MiB", "models_dir": tmp_path / "m"})
    settings = make_settings(tmp_path, device="simulated:256MiB", models=source.settings().models)
    asked = {"q": "smol", "context": 2048}
    with live_server(settings, models_source=source) as live:
        first = httpx.get(live.url + "/admin/models/search", params=asked, timeout=60).json()
        [found] = first["results"]
        assert found["repo"] == REPO and found["fits"]["chosen"] == "Q4_1"
        assert found["fits"]["quants"][0]["now"]["verdict"] == "gpu"
        assert found["fits"]["said"]["Q4_1"]["now"].startswith("fits on the GPU, 2048 tokens")
        assert found["fits"]["header_bytes"] == hub.sent[f"{REPO}/{SMOL}"] <= 2 * MiB
        live.service.device.set_external(200 * MiB)  # another program takes 200 MiB
        taken = httpx.get(live.url + "/admin/models/search", params=asked, timeout=60).json()
        now = taken["results"][0]["fits"]["quants"][0]["now"]
        assert now["verdict"] == "split" and now["gpu_layers"] < now["layers"] == 30
        assert taken["machine"]["free_bytes"] < first["machine"]["free_bytes"] - 190 * MiB
        assert main(["search", "smol", "--context", "2048", "--url", live.url]) == 0
        said = capsys.readouterr().out
        assert said.startswith("on Simulated") and f"hf:{REPO} (1 downloads)" in said
        assert "* Q4_1" in said and "layers on the CPU, 2048 tokens a request" in said
        empty = httpx.get(live.url + "/admin/models/search", params={"q": "llama"}).json()
        assert empty["results"] == []
        assert httpx.get(live.url + "/admin/models/search", params={"q": ""}).status_code == 400


@pytest.mark.slow  # a real llama.cpp load of SmolLM2
def test_the_search_answer_is_what_the_real_load_then_measures(hub, smollm2_gguf, tmp_path):
    """On the CPU, SmolLM2's Q4_1 as the search plans it at a 2,048 context against the
    same file loaded by llama.cpp with that context: the pool's cells the same, the bytes
    (what the engine's log reported allocating) within 10%."""
    spec = ModelSpec(
        name="smol", kind="generation", path=smollm2_gguf, context_length=2048, load="startup"
    )
    settings = make_settings(tmp_path, device="cpu", models=(spec,))
    with live_server(settings) as live:
        asked = {"q": "smol", "context": 2048}
        answer = httpx.get(live.url + "/admin/models/search", params=asked, timeout=60).json()
        planned = answer["results"][0]["fits"]["quants"][0]["now"]
        row = next(m for m in live.status()["models"] if m["name"] == "smol")
    measured = row["measured"]["device_bytes"] + row["measured"]["host_bytes"]
    assert planned["verdict"] == "cpu" and planned["kv_cells"] == row["kv_cells"]
    assert abs(planned["device_bytes"] - measured) <= 0.10 * measured, (planned, measured)
    print(f"planned {planned['device_bytes']} bytes, measured {measured}")


def test_a_name_of_the_configs_own_table_reaches_its_repo(hub, tmp_path):
    """`ollama_names` in the config: its name `mysmol` reaches the loopback Hub's SmolLM2
    repo (its header read for the answer); a server without it answers 404 with
    suggestions."""
    from app.config import ollama_names

    names = tmp_path / "names.toml"
    names.write_text(
        f'[[names]]\nname = "mysmol"\ndefault = "135m"\nquant = "Q4_1"\n'
        f'tags = {{ "135m" = "{REPO}" }}\n'
    )
    settings = make_settings(tmp_path, device="simulated:512MiB", ollama_names=names)
    try:
        with live_server(settings) as live:
            found = httpx.get(live.url + "/admin/models/fits", params={"source": "mysmol"})
        with live_server(make_settings(tmp_path, device="simulated:512MiB")) as live:
            unknown = httpx.get(live.url + "/admin/models/fits", params={"source": "mysmol"})
    finally:
        ollama_names.use(None)
    answer = found.json()
    assert found.status_code == 200 and answer["repo"] == REPO and answer["chosen"] == "Q4_1"
    assert answer["library"] == "mysmol:135m" and hub.sent[f"{REPO}/{SMOL}"] <= 2 * MiB
    assert unknown.status_code == 404 and unknown.json()["error"]["suggestions"] == ["smollm2"]
