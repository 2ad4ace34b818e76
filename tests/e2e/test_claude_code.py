"""Claude Code itself (`claude -p`, installed with npm into a temporary folder) answers
through a live server serving SmolLM2-135M behind `claude-*`. SmolLM2's context is 8,192
tokens and Claude Code's own system prompt and tools take about 30,700, so the test asks
with a short system prompt, no tools, and 512 output tokens (Claude Code asks for 32,000,
a 400 against that context). Skipped where npm or the package cannot be had.

Claude Code sends no `temperature`, so Anthropic's default of 1 would sample; a 135M model
sampled at 1 can ramble to the 512 tokens, and Claude Code then asks again to continue,
up to three more times (four requests, measured with a 6-token limit), which took CI past
two minutes. The model's config makes it greedy, as a user's may (`temperature = 0`,
which a request that leaves its temperature out takes): "Paris" in a few tokens."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from app.config.settings import ModelSpec
from tests.support import apps
from tests.support.live import live_server, make_settings, npm_binary

# Claude Code's settings for a local server: its own flags and environment variables.
ENVIRONMENT = {
    "ANTHROPIC_API_KEY": "anything",
    "ANTHROPIC_MODEL": "claude-sonnet-4-5",
    "ANTHROPIC_SMALL_FAST_MODEL": "claude-haiku-4-5",
    "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "512",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
}


@pytest.fixture(scope="module")
def claude(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return npm_binary(tmp_path_factory.mktemp("claude"), apps.NPM_APPS["claude"], "claude")


@pytest.mark.slow
def test_claude_code_answers_a_prompt_through_the_messages_api(claude, smollm2, tmp_path):
    model = ModelSpec(name="smollm2", kind="generation", path=smollm2, temperature=0.0)
    settings = make_settings(
        tmp_path, device="cpu", models=(model,), model_aliases={"claude-*": "smollm2"}
    )
    home = tmp_path / "home"
    home.mkdir()
    with live_server(settings) as live:
        argv = [str(claude), "-p", "What is the capital of France? One word."]
        argv += ["--tools", "", "--system-prompt", "You are a helpful assistant."]
        argv += ["--output-format", "json"]
        environment = {"PATH": "/usr/bin:/bin", "HOME": str(home), "ANTHROPIC_BASE_URL": live.url}
        done = subprocess.run(
            argv,
            env={**environment, **ENVIRONMENT},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        served = httpx.get(live.url + "/status", timeout=30).json()["counters"]["served"]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["result"].strip(), result
    assert result["usage"]["output_tokens"] > 0 and served >= 1
