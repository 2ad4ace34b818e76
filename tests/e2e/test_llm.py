"""Simon Willison's `llm` CLI (0.36 from PyPI, in a virtual environment of its own)
against a live vramgate serving SmolLM2, configured as docs/clients.md says: an entry in its
`extra-openai-models.yaml`. A prompt is answered (streamed, as llm asks by default), and
`--schema` gives JSON of that schema (vramgate's constrained decoding: a 135M model
would not write it unaided). Its tools (`-T`): a call made, run by llm and its result
answered. Skipped where the package cannot be installed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app.config.settings import ModelSpec
from app.models.tools import chat_messages
from tests.support import apps
from tests.support.live import RequestBodies, clean_env, live_server, make_settings, pip_binary
from tests.support.taught import taught

VERSION = "0.36"  # what llm's own llm_version tool returns
QUESTION = "What is the installed version of llm?"
CALL = '{"name": "llm_version", "arguments": {}}'  # a call in vramgate's instruction form
ANSWER = "The installed version of llm is 0.36."
MODELS = """- model_id: smollm2
  model_name: SmolLM2-135M-Instruct
  api_base: {url}/v1
  supports_schema: true
  supports_tools: true
"""


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_binary(tmp_path_factory.mktemp("llm"), apps.PIP_APPS["llm"], "llm")


@pytest.mark.slow
@pytest.mark.timeout(900)  # install, teaching, its runs: a busy machine
def test_llm_answers_a_prompt_and_a_schema(llm, smollm2, tmp_path):
    # greedy (llm sends no temperature), and room for the whole JSON object: cut at the
    # token limit, a sampled name string ran past 48 tokens and the object was not closed
    spec = ModelSpec(name="SmolLM2-135M-Instruct", kind="generation", path=smollm2, temperature=0.0)
    settings = make_settings(tmp_path / "server", device="cpu", models=(spec,))
    home = tmp_path / "llm-home"
    home.mkdir()
    with live_server(settings) as live:
        (home / "extra-openai-models.yaml").write_text(MODELS.format(url=live.url))
        environment = clean_env() | {"LLM_USER_PATH": str(home), "OPENAI_API_KEY": "unused"}

        def ask(*argv: str) -> str:
            done = subprocess.run(
                [str(llm), "-m", "smollm2", "-o", "max_tokens", "256", *argv],
                env=environment,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr[-2000:]
            return done.stdout

        assert ask("Say hello.").strip()
        person = json.loads(ask("--schema", "name, age int", "Invent a person."))
        served = live.status()["counters"]["served_by_model"]
    assert isinstance(person["name"], str) and isinstance(person["age"], int), person
    assert served.get("SmolLM2-135M-Instruct", 0) >= 2, served


def ask_with_a_tool(
    llm: Path, model: Path, where: Path
) -> tuple[subprocess.CompletedProcess, list]:
    """`llm -T llm_version --td` (its own tool, its tool debug output) asked the version
    against a live vramgate serving `model` greedily, and the chat requests' bodies as
    vramgate received them."""
    spec = ModelSpec(name="SmolLM2-135M-Instruct", kind="generation", path=model, temperature=0.0)
    settings = make_settings(where / "server", device="cpu", models=(spec,))
    home = where / "llm-home"
    home.mkdir(parents=True)
    fronts: list[RequestBodies] = []

    def front(app: Any) -> RequestBodies:
        fronts.append(RequestBodies(app))
        return fronts[-1]

    with live_server(settings, front=front) as live:
        (home / "extra-openai-models.yaml").write_text(MODELS.format(url=live.url))
        environment = clean_env() | {"LLM_USER_PATH": str(home), "OPENAI_API_KEY": "unused"}
        argv = [str(llm), "-m", "smollm2", "-o", "max_tokens", "64", "-T", "llm_version"]
        done = subprocess.run(
            [*argv, "--td", QUESTION],
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
        )
    return done, fronts[0].bodies("/v1/chat/completions")


def result_sent_back(asked: list[dict[str, Any]], call_id: str) -> list[dict[str, Any]]:
    """`asked` with the call to llm_version and its result after it, as OpenAI's API has
    a client send them back (llm's second request)."""
    function = {"name": "llm_version", "arguments": "{}"}
    call = {"id": call_id, "type": "function", "function": function}
    made = {"role": "assistant", "content": None, "tool_calls": [call]}
    return [*asked, made, {"role": "tool", "tool_call_id": call_id, "content": VERSION}]


@pytest.mark.slow
@pytest.mark.timeout(900)  # install, teaching, its runs: a busy machine
def test_llm_runs_the_tool_a_smollm2_taught_to_call_it_asks_for(llm, smollm2, tmp_path):
    """llm's tool loop through vramgate. SmolLM2 as it is answers in prose (the tool was
    sent). Taught on the spot (tests/support/taught.py) to answer that request, as
    vramgate renders it for a template that knows no tools, with a call in vramgate's
    instruction form, and the request that sends its result back with a sentence: vramgate
    answers llm with an OpenAI tool call, llm runs its tool and sends the result back (the
    request read off the wire is the one taught, ids aside), and prints the answer."""
    plain, sent = ask_with_a_tool(llm, smollm2, tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr[-2000:]
    (asked,) = sent  # no call, so no second request
    assert [tool["function"]["name"] for tool in asked["tools"]] == ["llm_version"]
    tools = asked["tools"]
    first = chat_messages(asked["messages"], tools, knows_tools=False)
    second = chat_messages(result_sent_back(asked["messages"], "call_0"), tools, False)
    lessons = [(first, CALL), (second, ANSWER)]
    model = taught(smollm2, lessons, tmp_path / "taught")
    done, sent = ask_with_a_tool(llm, model, tmp_path / "taught-run")
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(sent) == 2, sent  # the call, then its result sent back
    (call,) = sent[1]["messages"][-2]["tool_calls"]
    assert call["function"]["name"] == "llm_version"
    assert json.loads(call["function"]["arguments"] or "{}") == {}
    sent_back = result_sent_back(asked["messages"], call["id"])
    assert chat_messages(sent[1]["messages"], tools, False) == chat_messages(
        sent_back, tools, False
    )
    assert "llm_version" in done.stderr  # --td shows the call it ran
    assert ANSWER in done.stdout
