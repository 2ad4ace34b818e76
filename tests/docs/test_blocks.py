"""Every fenced block of README.md and docs/*.md, without a server: each is of a known
language and valid in it (a shell block parses in bash, a Python block compiles, a TOML
block is a config vramgate loads, or where marked not run, being another file's shape,
parses; a YAML or JSON block parses), and each says what the tests do with it: run
(tests/docs/test_examples.py), not run and why, or the output of the block before it. A
PowerShell block is skipped here, saying so: there is no PowerShell on the test
machines; the Windows job runs the suite on Windows.

How it fails: a command with a broken quote, a config with a misspelt setting or a
value out of bounds, a block in a language nothing checks, a `not run` without its
reason, an output that follows nothing that runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from app.config.settings import load_settings
from tests.docs.blocks import LANGS, Block, blocks, every_block, included_blocks

ALL = every_block()


@pytest.mark.parametrize("block", ALL + included_blocks(), ids=lambda b: b.id)
def test_the_block_is_valid_in_its_language(block: Block, tmp_path: Path):
    assert block.lang in LANGS, f"{block.id}: no test reads ```{block.lang}"
    if block.lang == "sh":
        if sys.platform == "win32":  # its `bash` may be WSL's, with no Linux installed
            pytest.skip("shell blocks are checked on Linux (.ci/run)")
        done = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True)
        assert done.returncode == 0, f"{block.id}: {done.stderr}"
    elif block.lang == "python":
        compile(block.text, block.id, "exec")
    elif block.lang == "toml":
        config = tmp_path / "config.toml"
        config.write_text(block.text, encoding="utf-8")
        tomllib.loads(block.text)
        if block.not_run:  # a file of another shape (its reason says which)
            return
        # the whole server's settings, as `vramgate serve --config` reads them
        load_settings({"data_dir": tmp_path / "data", "log_dir": tmp_path / "log"}, config)
    elif block.lang == "yaml":
        assert yaml.safe_load(block.text) is not None
    elif block.lang == "json":
        json.loads(block.text)
    elif block.lang == "powershell":
        if shutil.which("pwsh") is None:
            pytest.skip("PowerShell is not on this machine (a Windows block)")
        done = subprocess.run(
            ["pwsh", "-NoProfile", "-Command", "[scriptblock]::Create([Console]::In.ReadToEnd())"],
            input=block.text,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"{block.id}: {done.stderr}"


@pytest.mark.parametrize("block", ALL, ids=lambda b: b.id)
def test_the_block_says_what_the_tests_do_with_it(block: Block):
    if block.marker is not None:
        assert block.is_output or block.not_run, f"{block.id}: unknown line {block.marker!r}"
    if block.not_run is not None:
        assert len(block.not_run.split()) >= 3, f"{block.id}: say why it is not run"
    if block.lang in ("", "powershell"):
        assert block.marker, f"{block.id}: ```{block.lang} runs nowhere: mark it output or not run"


def test_an_output_follows_a_block_that_runs():
    for page in {b.page for b in ALL}:
        found = blocks(page)
        for k, block in enumerate(found):
            if block.is_output:
                assert k > 0 and found[k - 1].runs, f"{block.id}: an output of nothing that runs"


def test_the_parser_reads_the_pages():
    ids = {b.id for b in ALL}
    assert any(i.startswith("docs/api-openai.md") for i in ids)
    assert any(b.not_run for b in ALL) and any(b.is_output for b in ALL)
    assert sum(b.runs for b in ALL) >= 12
