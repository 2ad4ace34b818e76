"""Simon Willison's `llm` CLI (0.36 from PyPI, in a virtual environment of its own)
against a live vramgate serving SmolLM2, configured as README says: an entry in its
`extra-openai-models.yaml`. A prompt is answered (streamed, as llm asks by default), and
`--schema` gives JSON of that schema (vramgate's constrained decoding: a 135M model
would not write it unaided). Skipped where the package cannot be installed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from app.config.settings import ModelSpec
from tests.support.live import clean_env, live_server, make_settings, pip_binary

PACKAGE = "llm==0.36"
MODELS = """- model_id: smollm2
  model_name: SmolLM2-135M-Instruct
  api_base: {url}/v1
  supports_schema: true
  supports_tools: true
"""


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_binary(tmp_path_factory.mktemp("llm"), [PACKAGE], "llm")


@pytest.mark.slow
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
