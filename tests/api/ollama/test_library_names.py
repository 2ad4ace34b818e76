"""Ollama's library names at `/api/pull`, as the official `ollama` client and Open
WebUI's "pull a model" box send them: `smollm2:135m` and `llama3.2` reach the Hub repo
vramgate's names table maps them to (the Hub of tests/support/hub.py on loopback serving
a GGUF under that repo's name), the pulled model answers to the name it was pulled by,
and a name the table lacks is a 404 that says what to type instead, nothing fetched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ollama import Client, ResponseError

from app.config.settings import ConfigSource
from tests.support.hub import Hub
from tests.support.live import Live, live_server, make_settings

SMOL_REPO = "bartowski/SmolLM2-135M-Instruct-GGUF"  # the table's smollm2:135m
LLAMA_REPO = "bartowski/Llama-3.2-3B-Instruct-GGUF"  # the table's llama3.2 (3b)


def stand_in_gguf(path: Path) -> bytes:
    """A GGUF of one small tensor (gguf's own writer): a repo's file to pull, not to run."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.ones(4096, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def served(smollm2_gguf, tmp_path_factory) -> Iterator[tuple[Live, Hub, dict[str, bytes]]]:
    """A server that pulls into its config, HF_ENDPOINT at a Hub holding SmolLM2's real
    GGUF (Q4_1, the only quantisation of its repo) and a stand-in Llama 3.2 (Q4_K_M)."""
    from huggingface_hub import constants

    root = tmp_path_factory.mktemp("library")
    smol, llama = "SmolLM2-135M-Instruct-Q4_1.gguf", "Llama-3.2-3B-Instruct-Q4_K_M.gguf"
    files = {smol: smollm2_gguf.read_bytes(), llama: stand_in_gguf(root / "stand-in.gguf")}
    with Hub() as hub, pytest.MonkeyPatch.context() as patch:
        hub.add(SMOL_REPO, {smol: files[smol]})
        hub.add(LLAMA_REPO, {"README.md": b"# Llama 3.2\n", llama: files[llama]})
        patch.setattr(constants, "ENDPOINT", hub.url)  # as HF_ENDPOINT sets it
        patch.setattr(constants, "HF_HUB_OFFLINE", False)
        config = root / "config.toml"
        config.write_text('[[models]]\nname = "sim"\nkind = "simulated"\n')
        source = ConfigSource(config, {"device": "cpu", "models_dir": root / "models"})
        settings = make_settings(root, device="cpu", models=source.settings().models)
        with live_server(settings, models_source=source) as live:
            yield live, hub, files


@pytest.mark.slow  # SmolLM2's 98 MB through the loopback Hub, then its runner's first load
def test_the_ollama_client_pulls_a_library_name_and_chats_with_it(served):
    """Before the table: `smollm2:135m` was a 400 ("not a local folder ..."), nothing
    fetched."""
    live, hub, files = served
    hub.reset()
    client = Client(host=live.url)
    events = list(client.pull("smollm2:135m", stream=True))
    assert events[-1].status == "success", events[-1]
    assert any(f"smollm2:135m is {SMOL_REPO}" in (e.status or "") for e in events)
    counted = [e for e in events if e.total]
    assert (
        counted[-1].completed == counted[-1].total == len(files["SmolLM2-135M-Instruct-Q4_1.gguf"])
    )
    assert "SmolLM2-135M-Instruct-Q4_1" in [m.model for m in client.list().models]
    assert client.show("smollm2:135m").modelinfo["general.architecture"] == "llama"
    answer = client.chat(
        model="smollm2:135m",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        options={"temperature": 0, "num_predict": 12},
    )
    assert answer.model == "smollm2:135m" and answer.message.content and answer.eval_count
    assert set(hub.sent) == {f"{SMOL_REPO}/SmolLM2-135M-Instruct-Q4_1.gguf"}


def test_open_webuis_pull_box_pulls_llama3_2_by_its_library_name(served):
    """Open WebUI's backend forwards its pull box as `{"name": ..., "insecure": true}`
    (open_webui/routers/ollama.py, pull_model), streamed by default."""
    live, hub, files = served
    hub.reset()
    with httpx.stream(
        "POST", live.url + "/api/pull", json={"name": "llama3.2", "insecure": True}, timeout=60
    ) as answer:
        assert answer.status_code == 200
        events = [json.loads(line) for line in answer.iter_lines() if line]
    assert events[-1] == {
        "status": "success",
        "model": "Llama-3.2-3B-Instruct-Q4_K_M",
        "kind": "generation",
    }
    assert hub.sent[f"{LLAMA_REPO}/Llama-3.2-3B-Instruct-Q4_K_M.gguf"] == len(
        files["Llama-3.2-3B-Instruct-Q4_K_M.gguf"]
    )
    client = Client(host=live.url)
    for name in ("llama3.2", "llama3.2:latest", "llama3.2:3b"):  # `ollama run` shows first
        assert client.show(name).modelinfo["general.architecture"] == "llama", name


def test_a_name_the_table_lacks_is_a_404_saying_what_to_type_instead(served):
    live, hub, _ = served
    hub.reset()
    client = Client(host=live.url)
    with pytest.raises(ResponseError) as unknown:
        client.pull("llama3.9")
    assert unknown.value.status_code == 404
    assert "llama3.9" in unknown.value.error and "llama3.2" in unknown.value.error
    with pytest.raises(ResponseError) as no_size:
        client.pull("qwen3:5b")
    assert no_size.value.status_code == 404 and "qwen3:4b" in no_size.value.error
    body = httpx.post(live.url + "/admin/models/pull", json={"source": "gemma9"}).json()
    assert "gemma3" in body["error"]["suggestions"]
    assert not hub.sent and not hub.paths  # refused before the Hub was asked anything
