"""llama.cpp's engine that cannot be imported (xllamacpp's CUDA build on a machine
without the NVIDIA driver: its Windows build links cuda.lib, and delvewheel leaves
nvcuda.dll out) never breaks the server: the other models serve, GGUF models are refused
with the reason and what to do, in the load error and /status, and no runner is started
again for it."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.live import ServerProcess, clean_env, wait_until

MINILM = "all-MiniLM-L6-v2"
# CPython's own words (Python/dynload_win.c: "DLL load failed while importing %s: " and
# FormatMessageW's text for ERROR_MOD_NOT_FOUND, its CR LF cut) for xllamacpp's
# extension module `xllamacpp.xllamacpp` (short name "xllamacpp") whose nvcuda.dll is
# missing
WINDOWS_TEXT = "DLL load failed while importing xllamacpp: The specified module could not be found."
NO_DRIVER = textwrap.dedent(f"""
    # As on Windows without the NVIDIA driver: the package is found (find_spec), importing
    # its extension module fails with the loader's error.
    import sys

    class NoDriver:
        def find_spec(self, name, path=None, target=None):
            if name == "xllamacpp.xllamacpp":
                raise ImportError({WINDOWS_TEXT!r}, name="xllamacpp")
            return None

    sys.meta_path.insert(0, NoDriver())
""")


def smoke_test():
    """packaging/smoke_test.py (a script, not a package: loaded from its path)."""
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "packaging" / "smoke_test.py"
    spec = importlib.util.spec_from_file_location("smoke_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gguf_row(url: str) -> dict:
    models = httpx.get(url + "/status", timeout=30).json()["models"]
    return next(m for m in models if m["name"] == "smol")


@pytest.mark.slow
def test_without_the_driver_the_embedder_serves_and_the_gguf_model_is_refused_saying_why(
    tmp_path, smollm2_gguf
):
    site = tmp_path / "no-driver"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_DRIVER)
    repo = str(Path(__file__).resolve().parents[3])
    env = clean_env() | {"PYTHONPATH": os.pathsep.join((str(site), repo))}
    config = tmp_path / "config.toml"
    config.write_text(
        f'device = "cpu"\n[[models]]\nname = "{MINILM}"\nkind = "embedding"\n'
        f'[[models]]\nname = "smol"\nkind = "generation"\n'
        f'path = "{smollm2_gguf.as_posix()}"\ncontext_length = 2048\n'
    )
    argv = [sys.executable, "-m", "app", "serve", "--config", str(config)]
    argv += ["--data-dir", str(tmp_path / "d"), "--log-dir", str(tmp_path / "l")]
    server = ServerProcess(argv, env)
    try:
        server.wait_ready(180)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        chat = {"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        with pytest.raises(openai.APIStatusError):  # 503 while it tries: model_loading
            client.chat.completions.create(**chat)
        wait_until(lambda: gguf_row(server.url)["state"] == "failed", 120, "the load refused")
        error = gguf_row(server.url)["error"]
        assert error.startswith("EngineUnavailable: llama.cpp's engine (xllamacpp) cannot load")
        assert WINDOWS_TEXT in error and "NVIDIA driver" in error, error
        with pytest.raises(openai.NotFoundError) as refused:
            client.chat.completions.create(**chat)
        assert WINDOWS_TEXT in str(refused.value) and "NVIDIA driver" in str(refused.value)
        # The bundle's smoke test in the mode a runner without the driver allows.
        assert "NVIDIA driver" in smoke_test().refused_chat(server.url, "smol", timeout=30)
        # Loading it again is refused at once, with the same reason, no runner started.
        again = httpx.post(server.url + "/admin/models/smol/load", timeout=60)
        assert gguf_row(server.url)["error"] == error, again.text
        # The positive control: the embedder serves, the server is ready and alive.
        vectors = client.embeddings.create(model=MINILM, input=["a cat", "a dog"]).data
        assert [len(v.embedding) for v in vectors] == [384, 384]
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        assert server.process.poll() is None
    finally:
        assert server.stop() == 0
    log = (tmp_path / "l" / "server.log").read_text(errors="replace")
    assert log.count("GGUF models cannot load") == 1  # one runner tried, then remembered
