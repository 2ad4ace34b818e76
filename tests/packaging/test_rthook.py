"""The runtime hook's DLL search path set-up, on a fake Windows bundle."""

from __future__ import annotations

import json
import os

from rthook_cuda_paths import configure, library_folders

from tests.packaging.test_cuda_libs import tree


def fake_bundle(tmp_path):
    return tree(
        tmp_path,
        {
            "torch/lib": ["torch_cuda.dll"],
            "nvidia/cu13/bin/x86_64": ["cublas64_13.dll"],
            "nvidia/cudnn/bin": ["cudnn64_9.dll"],
            "nvidia/cudnn/include": ["cudnn.h"],
        },
    )


def test_windows_adds_every_library_folder_and_hides_cuda_path(tmp_path):
    root = fake_bundle(tmp_path)
    added: list[str] = []
    environ = {"PATH": "SYSTEM-PATH", "CUDA_PATH": "C:\\CUDA\\v12.4", "CUDA_PATH_V12_4": "x"}
    handles = configure(root, "win32", environ, lambda p: added.append(p) or f"handle:{p}")
    expected = [
        str(root / "torch/lib"),
        str(root / "nvidia/cu13/bin/x86_64"),
        str(root / "nvidia/cudnn/bin"),
    ]
    assert added == expected
    assert handles == [f"handle:{p}" for p in expected]
    assert environ["PATH"].split(os.pathsep) == [*expected, "SYSTEM-PATH"]
    assert "CUDA_PATH" not in environ and "CUDA_PATH_V12_4" not in environ


def test_linux_is_a_no_op(tmp_path):
    environ = {"PATH": "/usr/bin", "CUDA_PATH": "/usr/local/cuda"}
    assert configure(fake_bundle(tmp_path), "linux", environ, lambda p: 1 / 0) == []
    assert environ == {"PATH": "/usr/bin", "CUDA_PATH": "/usr/local/cuda"}


def test_folders_without_dlls_are_left_out(tmp_path):
    root = fake_bundle(tmp_path)
    assert root / "nvidia/cudnn/include" not in library_folders(root)


def test_a_release_part_not_extracted_is_named(tmp_path):
    """The CUDA release comes in zip parts (release_assets.py): the app's part lists
    them; a part whose marker is missing is named, so the person knows what to extract."""
    from rthook_cuda_paths import missing_parts, missing_parts_text

    internal = tmp_path / "_internal"
    (internal / "vramgate-parts").mkdir(parents=True)
    assert missing_parts(internal) == []  # built and run in place: no manifest
    parts = ["vramgate-windows-cuda", "vramgate-windows-cuda-runtime-1"]
    (internal / "vramgate-parts.json").write_text(json.dumps(parts))
    (internal / "vramgate-parts" / "vramgate-windows-cuda.txt").write_text("x")
    assert missing_parts(internal) == ["vramgate-windows-cuda-runtime-1.zip"]
    assert "extract vramgate-windows-cuda-runtime-1.zip into the same folder" in (
        missing_parts_text(missing_parts(internal))
    )
    (internal / "vramgate-parts" / "vramgate-windows-cuda-runtime-1.txt").write_text("x")
    assert missing_parts(internal) == []
