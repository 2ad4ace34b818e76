"""The pages' examples, run as a reader runs them: every shell and Python block that
is not marked otherwise (tests/docs/blocks.py) runs in its own process against one live
server, the address on the page pointed at it, in a folder holding the files the
examples open (photo.png, mask.png, talk.mp3). The server serves what the pages name:
the embedded all-MiniLM-L6-v2, the real SmolLM2-135M-Instruct GGUF (`smollm2` and
`qwen3` reach it too), and tiny random models as `reranker`, `sd15`, `whisper` and
`mms-tts-eng`.

Each must end with exit code 0 and no error in what it printed (an answer `{"error":
...}` counts); where the page shows its output (a block marked `output` after it),
what it printed must match: the same text, or for JSON the same keys and shapes, and
the same values where an answer's text does not vary (`object`, `model`, `role`,
`finish_reason`...).

How it fails: an example that names a route, a field or a model the server does not
have, a client call the installed client no longer takes, an answer whose shape differs
from the one the page shows."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.docs.blocks import Block, with_outputs
from tests.support.live import clean_env, live_server, make_settings
from tests.support.random_models import save_random_cross_encoder, save_random_sd15
from tests.support.random_vits import save_random_vits
from tests.support.random_whisper import save_random_whisper, tone, write_encoded

# a minute with the server's start and SmolLM2's fetch: the full run only (CI's lowest
# versions and the Windows job run `-m "not slow"`), as the other real-model tests
pytestmark = pytest.mark.slow

# the values an answer's shape fixes (an answer's own text, ids and numbers vary)
FIXED = {"object", "model", "role", "finish_reason", "type", "status", "done_reason", "stop_reason"}
EXAMPLES = with_outputs()


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: Path):
    tmp = tmp_path_factory.mktemp("docs")
    models = [
        {"name": "all-MiniLM-L6-v2"},
        {"name": "SmolLM2-135M-Instruct", "kind": "generation", "path": str(smollm2_gguf)},
        {"name": "sd15", "kind": "diffusion", "path": str(save_random_sd15(tmp / "sd15"))},
        {"name": "reranker", "kind": "rerank", "path": str(save_random_cross_encoder(tmp / "ce"))},
        {"name": "whisper", "kind": "speech", "path": str(save_random_whisper(tmp / "whisper"))},
        {
            "name": "mms-tts-eng",
            "kind": "speech_synthesis",
            "path": str(save_random_vits(tmp / "mms-tts-eng")),
        },
    ]
    aliases = {"smollm2": "SmolLM2-135M-Instruct", "qwen3": "SmolLM2-135M-Instruct"}
    settings = make_settings(tmp, device="cpu", models=models, model_aliases=aliases)
    with live_server(settings) as live:
        yield live


@pytest.fixture(scope="module")
def reader_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the examples open, as a reader would have them."""
    where = tmp_path_factory.mktemp("reader")
    pixels = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(where / "photo.png")
    mask = Image.new("RGBA", (64, 64), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), (16, 16, 48, 48))  # transparent: repainted
    mask.save(where / "mask.png")
    write_encoded(where / "talk.mp3", tone(3.0, seed=1))
    return where


def run(block: Block, url: str, cwd: Path) -> str:
    """The block in its own process, as a reader runs it; its standard output."""
    import subprocess

    text = block.pointed_at(url)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = clean_env() | {"PATH": path}
    if block.lang == "sh":
        argv = ["bash", "-e", "-o", "pipefail", "-c", text]
    else:
        argv = [sys.executable, "-c", text]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{block.id} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def documents(printed: str) -> list[Any]:
    """The JSON documents it printed: one, or one a line (NDJSON)."""
    try:
        return [json.loads(printed)]
    except json.JSONDecodeError:
        found = []
        for line in printed.splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return found


def same_shape(shown: Any, got: Any, where: str = "") -> list[str]:
    """Where `got` differs from what the page shows: a key it lacks, another type, or
    another value of a key whose value is fixed."""
    if isinstance(shown, dict):
        if not isinstance(got, dict):
            return [f"{where}: {type(got).__name__}, the page shows an object"]
        diffs = []
        for key, value in shown.items():
            if key not in got:
                diffs.append(f"{where}.{key}: missing")
            elif key in FIXED and not isinstance(value, dict | list) and value != got[key]:
                diffs.append(f"{where}.{key}: {got[key]!r}, the page shows {value!r}")
            else:
                diffs += same_shape(value, got[key], f"{where}.{key}")
        return diffs
    if isinstance(shown, list):
        if not isinstance(got, list) or (shown and not got):
            return [f"{where}: {got!r}, the page shows a list"]
        return same_shape(shown[0], got[0], f"{where}[0]") if shown else []
    if isinstance(shown, bool) or isinstance(got, bool):
        return [] if type(shown) is type(got) else [f"{where}: {got!r}, not {shown!r}'s type"]
    if isinstance(shown, int | float) and isinstance(got, int | float):
        return []
    return [] if type(shown) is type(got) else [f"{where}: {got!r}, not {shown!r}'s type"]


@pytest.mark.parametrize(("block", "output"), EXAMPLES, ids=[b.id for b, _ in EXAMPLES])
def test_the_example_runs_and_prints_what_the_page_shows(
    block: Block, output: Block | None, docs_server: Any, reader_folder: Path
):
    printed = run(block, docs_server.url, reader_folder)
    errors = [d for d in documents(printed) if isinstance(d, dict) and "error" in d]
    assert not errors, f"{block.id} answered an error: {errors}"
    if output is None:
        return
    if output.lang == "json":
        (got,) = documents(printed)
        diffs = same_shape(json.loads(output.text), got)
        assert not diffs, f"{block.id} answered otherwise than {output.id}: {diffs}\n{printed}"
    else:
        assert printed.strip() == output.text.strip(), f"{block.id}, against {output.id}"


def test_same_shape_tells_a_changed_answer():
    shown = {"object": "chat.completion", "choices": [{"message": {"content": "x"}}]}
    assert not same_shape(
        shown, {"object": "chat.completion", "choices": [{"message": {"content": "y"}}]}
    )
    assert same_shape(shown, {"object": "text_completion", "choices": [{"message": {}}]}) == [
        ": 'text_completion', the page shows 'chat.completion'".replace(":", ".object:", 1),
        ".choices[0].message.content: missing",
    ]
