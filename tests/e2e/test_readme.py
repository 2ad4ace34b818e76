"""The README's promises: its first command serves the default model to the official
openai client; its second command is what CI runs; its metric names are the real ones."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from openai import OpenAI

from tests.support.live import ServerProcess, clean_env

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def setup_commands() -> list[str]:
    block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert block, "the README opens with a shell block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_setup_commands():
    assert README.index("```sh") < README.index("\n## ")
    first, second = setup_commands()
    assert first.endswith("vramgate serve")
    assert "pytest" in second


def test_ci_runs_the_readmes_test_command():
    assert setup_commands()[1] in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow
def test_first_command_serves_the_default_model_to_the_openai_client(tmp_path):
    command = shutil.which("vramgate", path=os.path.dirname(sys.executable))
    assert command, "the first command installs the `vramgate` script"
    env = clean_env() | {
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    server = ServerProcess([command, "serve"], env)
    try:
        server.wait_ready(180)
        client = OpenAI(base_url=server.url + "/v1", api_key="unused")
        texts = [
            "How do I bake bread at home?",
            "What is a simple recipe for homemade bread?",
            "The stock market fell sharply on Monday.",
        ]
        data = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts).data
        a, b, c = (np.asarray(d.embedding) for d in data)
        assert len(a) == 384
        assert a @ b > a @ c
    finally:
        assert server.stop() == 0
