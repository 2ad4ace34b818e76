"""aider itself (aider-chat 0.86.2 from PyPI, in a virtual environment of its own) asks a
live vramgate for an edit, on docs/clients.md's settings: OpenAI's API at /v1 and a model metadata
file giving the model's context and output limit from vramgate's `/v1/models` (aider
reads them from litellm's price list, which names no local model: without the file it
warns of a context of 0). Through litellm as aider calls it, streamed.

First SmolLM2 as it is: the request is served and the answer streamed back and counted,
but SmolLM2-135M never writes aider's edit formats, so the file stays as it was. Then the
edit round trip: SmolLM2 taught, on the spot, to answer the messages aider sent in that
first run (as vramgate received them) with a *file listing* (tests/support/taught.py; no
model that writes one by itself can be fetched or run here), served by vramgate and asked
again by a fresh aider, which applies the edit to the file. Skipped where the package
cannot be installed."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config.settings import ModelSpec
from tests.support import apps
from tests.support.live import RequestBodies, clean_env, live_server, make_settings, pip_binary
from tests.support.taught import taught

ASKED = "Change the greeting to say goodbye."
BEFORE = 'print("hello")\n'
AFTER = 'print("goodbye")\n'
LISTING = 'hello.py\n```\nprint("goodbye")\n```'  # aider's whole-file format, as it asks


@dataclass
class Run:
    said: str  # aider's stdout and stderr
    returncode: int
    served: int  # requests vramgate answered for the model
    sent: list[dict[str, Any]]  # the bodies of its chat requests, as vramgate received them
    file: str  # hello.py afterwards


@pytest.fixture(scope="module")
def aider(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_binary(tmp_path_factory.mktemp("aider"), apps.PIP_APPS["aider"], "aider")


def run_aider(aider: Path, model: Path, where: Path) -> Run:
    """A fresh aider asked ASKED about a hello.py holding BEFORE, against a live vramgate
    serving `model` greedily as "smollm2"."""
    spec = ModelSpec(name="smollm2", kind="generation", path=model, temperature=0.0)
    settings = make_settings(where / "server", device="cpu", models=(spec,))
    work = where / "work"
    work.mkdir(parents=True)
    (work / "hello.py").write_text(BEFORE)
    fronts: list[RequestBodies] = []

    def front(app: Any) -> RequestBodies:
        fronts.append(RequestBodies(app))
        return fronts[-1]

    with live_server(settings, front=front) as live:
        listed = httpx.get(live.url + "/v1/models", timeout=30).json()["data"]
        context = next(m["context_length"] for m in listed if m["id"] == "smollm2")
        metadata = where / "models.json"
        limits = {"max_input_tokens": context, "max_output_tokens": 256}
        costs = {"input_cost_per_token": 0, "output_cost_per_token": 0}
        entry = {**limits, **costs, "litellm_provider": "openai", "mode": "chat"}
        metadata.write_text(json.dumps({"openai/smollm2": entry}))
        environment = clean_env() | {
            "HOME": str(where),
            "OPENAI_API_BASE": live.url + "/v1",
            "OPENAI_API_KEY": "unused",
        }
        argv = [str(aider), "--model", "openai/smollm2", "--model-metadata-file", str(metadata)]
        argv += ["--no-git", "--yes-always", "--no-check-update", "--no-analytics"]
        argv += ["--no-pretty", "--map-tokens", "0", "--edit-format", "whole"]
        argv += ["--message", ASKED, "hello.py"]
        done = subprocess.run(
            argv, env=environment, cwd=work, capture_output=True, text=True, timeout=600
        )
        served = live.status()["counters"]["served_by_model"].get("smollm2", 0)
    return Run(
        said=done.stdout + done.stderr,
        returncode=done.returncode,
        served=served,
        sent=fronts[0].bodies("/v1/chat/completions"),
        file=(work / "hello.py").read_text(),
    )


@pytest.fixture(scope="module")
def untaught(aider: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_aider(aider, smollm2, tmp_path_factory.mktemp("aider-smollm2"))


@pytest.mark.slow
@pytest.mark.timeout(900)  # install, teaching, two runs: a busy machine
def test_aider_asks_for_an_edit_and_reads_the_streamed_answer(untaught: Run):
    said = untaught.said
    assert untaught.returncode == 0, said[-3000:]
    counted = re.search(r"Tokens: ([\d,.k]+) sent, ([\d,.k]+) received", said)
    assert counted is not None and counted[2] != "0", said[-3000:]
    assert "of 0" not in said  # the metadata file gave it the model's context
    assert untaught.served >= 1  # its request was answered by vramgate
    assert untaught.file == BEFORE  # SmolLM2 as it is writes no file listing


@pytest.mark.slow
@pytest.mark.timeout(900)  # install, teaching, two runs: a busy machine
def test_aider_applies_the_edit_a_smollm2_taught_that_answer_streams_back(
    aider: Path, smollm2: Path, untaught: Run, tmp_path: Path
):
    messages = untaught.sent[0]["messages"]
    roles = [m["role"] for m in messages]
    assert roles[0] == "system" and roles[-1] == "user", roles
    assert ASKED in messages[-1]["content"] and BEFORE.strip() in messages[-3]["content"]
    model = taught(smollm2, [(messages, LISTING)], tmp_path / "taught")
    edited = run_aider(aider, model, tmp_path / "edit")
    assert edited.returncode == 0, edited.said[-3000:]
    assert edited.served >= 1
    assert "Applied edit to hello.py" in edited.said, edited.said[-3000:]
    assert edited.file == AFTER
