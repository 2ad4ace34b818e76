"""An engine for every PC: a runner falls back to llama.cpp's CPU build (the folder a
bundle carries beside its CUDA build) when the first build cannot be imported here, and
/status says which build serves. The CUDA build without the NVIDIA driver is a stand-in
package that fails to import with CPython's own words for it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import httpx
import pytest

from app.engines.llama_cpp import engine_builds
from app.engines.llama_cpp.engine_builds import (
    BUILD_FLAG,
    RUNNER_MODULE,
    EngineBuild,
    build_kind,
    builds_here,
    use_build,
)
from tests.engines.llama_cpp.pools import serving

# CPython's words (Python/dynload_win.c) for xllamacpp's CUDA build whose nvcuda.dll,
# the NVIDIA driver's, is missing (tests/engines/llama_cpp/test_engine_unavailable.py)
WINDOWS_TEXT = "DLL load failed while importing xllamacpp: The specified module could not be found."


def package(folder: Path, libraries: tuple[str, ...] = (), init: str = "") -> Path:
    """An `xllamacpp` package in `folder`, with delvewheel's library folder beside it."""
    (folder / "xllamacpp").mkdir(parents=True)
    (folder / "xllamacpp" / "__init__.py").write_text(init)
    if libraries:
        (folder / "xllamacpp.libs").mkdir()
        for name in libraries:
            (folder / "xllamacpp.libs" / name).write_bytes(b"")
    return folder / "xllamacpp"


def cuda_without_driver(folder: Path) -> Path:
    """xllamacpp's CUDA build (its cuBLAS beside it) on a PC without the NVIDIA driver."""
    init = f"raise ImportError({WINDOWS_TEXT!r}, name='xllamacpp')\n"
    return package(folder, ("cublas64_12-0f3c.dll", "ggml-cuda-1a2b.dll"), init)


@pytest.mark.parametrize(
    ("libraries", "kind"),
    [
        (("cublas64_12-0f3c.dll", "cublasLt64_12-9e1d.dll"), "cuda"),  # Windows, delvewheel
        (("libggml-cuda-5d1e.so",), "cuda"),
        (("vulkan-1-77aa.dll",), "vulkan"),
        (("amdhip64_6-0c1d.dll",), "rocm"),
        ((), "cpu"),  # the CPU wheel: one extension module, no libraries beside it
    ],
)
def test_a_builds_kind_is_read_from_its_libraries(tmp_path, libraries, kind):
    assert build_kind(package(tmp_path, libraries)) == kind


def test_a_bundle_tries_its_installed_build_then_its_cpu_build(tmp_path, monkeypatch):
    cuda = cuda_without_driver(tmp_path / "site")
    monkeypatch.setattr(engine_builds, "installed_build", lambda: EngineBuild(build_kind(cuda)))
    root = tmp_path / "_internal"
    assert builds_here(root) == (EngineBuild("cuda"),)  # no CPU build carried
    package(root / "llama-cpu")
    assert builds_here(root) == (EngineBuild("cuda"), EngineBuild("cpu", root / "llama-cpu"))


def test_a_runner_on_a_build_in_a_folder_imports_from_it_first(tmp_path, monkeypatch):
    build = EngineBuild("cpu", tmp_path / "llama-cpu")
    frozen = build.runner_argv(["vramgate-cli.exe", "_llama-runner"], frozen=True)
    assert frozen == ["vramgate-cli.exe", "_llama-runner", BUILD_FLAG, str(build.folder)]
    source = build.runner_argv([sys.executable, "-m", "x"], frozen=False)
    assert source == [sys.executable, "-m", RUNNER_MODULE, BUILD_FLAG, str(build.folder)]
    assert EngineBuild("cuda").runner_argv(["a", "b"], frozen=True) == ["a", "b"]
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert use_build(["--x", BUILD_FLAG, str(build.folder)]) == ["--x"]
    assert sys.path[0] == str(build.folder)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_without_the_cuda_build_a_gguf_chat_is_served_by_the_cpu_build(
    tmp_path, monkeypatch, smollm2_gguf
):
    spec = importlib.util.find_spec("xllamacpp")
    assert spec is not None and spec.submodule_search_locations
    real = Path(next(iter(spec.submodule_search_locations)))
    # the bundle: its CUDA build is what Python finds (the runner's PYTHONPATH puts the
    # stand-in first), its CPU build is in _internal/llama-cpu
    cuda = cuda_without_driver(tmp_path / "cuda")
    root = tmp_path / "_internal"
    (root / "llama-cpu").mkdir(parents=True)
    (root / "llama-cpu" / "xllamacpp").symlink_to(real, target_is_directory=True)
    for name in [m for m in sys.modules if m.split(".")[0] == "xllamacpp"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(cuda.parent))  # this process finds the CUDA build too
    monkeypatch.setenv("PYTHONPATH", str(cuda.parent))
    monkeypatch.setattr(engine_builds, "bundle_root", lambda: root)
    assert builds_here() == (EngineBuild("cuda"), EngineBuild("cpu", root / "llama-cpu"))

    with serving(smollm2_gguf, tmp_path / "server", context=1024, parallel=1) as live:
        chat = {"model": "smol", "messages": [{"role": "user", "content": "Hi"}]}
        answer = httpx.post(
            live.url + "/v1/chat/completions", json={**chat, "max_tokens": 8}, timeout=300
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
        (row,) = [m for m in live.status()["models"] if m["name"] == "smol"]
    assert row["engine_build"] == {
        "kind": "cpu",
        "not_loaded": [{"kind": "cuda", "error": f"ImportError: {WINDOWS_TEXT}"}],
    }
