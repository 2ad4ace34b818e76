"""aider itself (aider-chat 0.86.2 from PyPI, in a virtual environment of its own) asks a
live vramgate serving SmolLM2 for an edit, on README's settings: OpenAI's API at /v1 and
a model metadata file giving the model's context and output limit from vramgate's
`/v1/models` (aider reads them from litellm's price list, which names no local model:
without the file it warns of a context of 0). One round trip, through litellm as aider
calls it: the request served, the answer streamed back and counted. SmolLM2-135M does not
write aider's edit formats, so the file is not changed: what is tested is the trip, not
the model's edit. Skipped where the package cannot be installed."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from app.config.settings import ModelSpec
from tests.support.live import clean_env, live_server, make_settings, pip_binary

PACKAGE = "aider-chat==0.86.2"


@pytest.fixture(scope="module")
def aider(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_binary(tmp_path_factory.mktemp("aider"), [PACKAGE], "aider")


@pytest.mark.slow
def test_aider_asks_for_an_edit_and_reads_the_streamed_answer(aider, smollm2, tmp_path):
    spec = ModelSpec(name="smollm2", kind="generation", path=smollm2, temperature=0.0)
    settings = make_settings(tmp_path / "server", device="cpu", models=(spec,))
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text('print("hello")\n')
    with live_server(settings) as live:
        listed = httpx.get(live.url + "/v1/models", timeout=30).json()["data"]
        context = next(m["context_length"] for m in listed if m["id"] == "smollm2")
        metadata = tmp_path / "models.json"
        limits = {"max_input_tokens": context, "max_output_tokens": 256}
        costs = {"input_cost_per_token": 0, "output_cost_per_token": 0}
        entry = {**limits, **costs, "litellm_provider": "openai", "mode": "chat"}
        metadata.write_text(json.dumps({"openai/smollm2": entry}))
        environment = clean_env() | {
            "HOME": str(tmp_path),
            "OPENAI_API_BASE": live.url + "/v1",
            "OPENAI_API_KEY": "unused",
        }
        argv = [str(aider), "--model", "openai/smollm2", "--model-metadata-file", str(metadata)]
        argv += ["--no-git", "--yes-always", "--no-check-update", "--no-analytics"]
        argv += ["--no-pretty", "--map-tokens", "0", "--edit-format", "whole"]
        argv += ["--message", "Change the greeting to say goodbye.", "hello.py"]
        done = subprocess.run(
            argv, env=environment, cwd=work, capture_output=True, text=True, timeout=600
        )
        served = live.status()["counters"]["served_by_model"].get("smollm2", 0)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    counted = re.search(r"Tokens: ([\d,.k]+) sent, ([\d,.k]+) received", said)
    assert counted is not None and counted[2] != "0", said[-3000:]
    assert "of 0" not in said  # the metadata file gave it the model's context
    assert served >= 1  # its request was answered by vramgate
