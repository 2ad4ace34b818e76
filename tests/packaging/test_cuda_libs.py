"""The CUDA library selection on fake site-packages trees of every layout we meet."""

from __future__ import annotations

from pathlib import Path

import cuda_libs
import pytest
from cuda_libs import library_folders, missing_groups, select_libraries

CUDNN_WIN = [
    "cudnn64_9.dll",
    "cudnn_ops64_9.dll",
    "cudnn_cnn64_9.dll",
    "cudnn_adv64_9.dll",
    "cudnn_graph64_9.dll",
    "cudnn_heuristic64_9.dll",
    "cudnn_engines_precompiled64_9.dll",
    "cudnn_engines_runtime_compiled64_9.dll",
]
CUDNN_LINUX = [
    "libcudnn.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_cnn.so.9",
    "libcudnn_adv.so.9",
    "libcudnn_graph.so.9",
    "libcudnn_heuristic.so.9",
    "libcudnn_engines_precompiled.so.9",
    "libcudnn_engines_runtime_compiled.so.9",
]


def tree(root: Path, files: dict[str, list[str]]) -> Path:
    for folder, names in files.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for name in names:
            (root / folder / name).write_bytes(b"\0")
    return root


def picked(libs) -> set[str]:
    return {f"{lib.dest}/{lib.name}" for lib in libs}


def test_windows_cu12_per_package_wheels(tmp_path):
    site = tree(
        tmp_path,
        {
            "torch/lib": ["torch_cuda.dll", "c10_cuda.dll", "torch_cpu.dll", "caffe2_nvrtc.dll"],
            "nvidia/cublas/bin": ["cublas64_12.dll", "cublasLt64_12.dll", "nvblas64_12.dll"],
            "nvidia/cublas/lib/x64": ["cublas.lib"],
            "nvidia/cuda_runtime/bin": ["cudart64_12.dll"],
            "nvidia/cuda_nvrtc/bin": ["nvrtc64_120_0.dll", "nvrtc-builtins64_124.dll"],
            "nvidia/nvjitlink/bin": ["nvJitLink_120_0.dll"],
            "nvidia/cudnn/bin": CUDNN_WIN,
            "nvidia/cudnn/include": ["cudnn.h"],
            "nvidia/cufft/bin": ["cufft64_11.dll"],
        },
    )
    libs = select_libraries(site, "windows")
    names = picked(libs)
    assert {
        "nvidia/cublas/bin/cublas64_12.dll",
        "nvidia/cublas/bin/cublasLt64_12.dll",
        "nvidia/cuda_runtime/bin/cudart64_12.dll",
        "nvidia/nvjitlink/bin/nvJitLink_120_0.dll",
        "nvidia/cuda_nvrtc/bin/nvrtc-builtins64_124.dll",
        "torch/lib/caffe2_nvrtc.dll",
    } <= names
    assert {f"nvidia/cudnn/bin/{n}" for n in CUDNN_WIN} <= names
    assert not any(n.endswith((".lib", ".h")) or "nvblas" in n for n in names)
    assert "torch/lib/torch_cpu.dll" not in names  # PyInstaller's torch hook carries torch
    assert missing_groups(libs) == []


def test_windows_cu13_shared_folder(tmp_path):
    site = tree(
        tmp_path,
        {
            "nvidia/cu13/bin/x86_64": [
                "cublas64_13.dll",
                "cublasLt64_13.dll",
                "cudart64_13.dll",
                "nvrtc64_130_0.dll",
                "nvJitLink_130_0.dll",
                "cusparse64_12.dll",
                "curand64_10.dll",
                "cusolver64_12.dll",
            ],
            "nvidia/cu13/lib/x64": ["cudart.lib", "cublas.lib"],
            "nvidia/cudnn/bin": CUDNN_WIN,
        },
    )
    libs = select_libraries(site, "windows")
    assert "nvidia/cu13/bin/x86_64/cublasLt64_13.dll" in picked(libs)
    assert missing_groups(libs) == []
    assert library_folders(libs) == ["nvidia/cu13/bin/x86_64", "nvidia/cudnn/bin"]


def test_windows_torch_bundled_libraries(tmp_path):
    site = tree(
        tmp_path,
        {
            "torch/lib": [
                "torch_cuda.dll",
                "cublas64_11.dll",
                "cublasLt64_11.dll",
                "cudart64_110.dll",
                "zlibwapi.dll",
                "nvcuda.dll",
                *CUDNN_WIN,
            ]
        },
    )
    libs = select_libraries(site, "windows")
    assert {lib.dest for lib in libs} == {"torch/lib"}
    assert "torch/lib/nvcuda.dll" not in picked(libs)  # the driver is the user's
    assert "torch/lib/zlibwapi.dll" in picked(libs)
    assert missing_groups(libs) == []


def test_linux_cu13(tmp_path):
    site = tree(
        tmp_path,
        {
            "torch/lib": ["libtorch_cuda.so", "libc10_cuda.so"],
            "nvidia/cu13/lib": [
                "libcublas.so.13",
                "libcublasLt.so.13",
                "libnvblas.so.13",
                "libcudart.so.13",
                "libcudart_static.a",
                "libcudadevrt.a",
                "libnvrtc.so.13",
                "libnvJitLink.so.13",
                "libcusparseLt.so.0",
            ],
            "nvidia/cudnn/lib": CUDNN_LINUX,
            "nvidia/nccl/lib": ["libnccl.so.2"],
            "nvidia/cu13/lib/stubs": ["libcuda.so"],
        },
    )
    libs = select_libraries(site, "linux")
    names = picked(libs)
    assert {
        "nvidia/cu13/lib/libcublasLt.so.13",
        "nvidia/cu13/lib/libcudart.so.13",
        "nvidia/nccl/lib/libnccl.so.2",
    } <= names
    assert {f"nvidia/cudnn/lib/{n}" for n in CUDNN_LINUX} <= names
    assert not any(n.endswith(".a") or "libcuda.so" in n or "nvblas" in n for n in names)
    assert missing_groups(libs) == []


def test_cpu_only_has_nothing_to_carry(tmp_path):
    site = tree(tmp_path, {"torch/lib": ["libtorch_cpu.so", "libc10.so", "libgomp.so.1"]})
    libs = select_libraries(site, "linux")
    assert libs == []
    assert missing_groups(libs) == list(cuda_libs.REQUIRED_GROUPS)


@pytest.mark.parametrize(
    ("name", "platform", "group"),
    [
        ("CUBLAS64_12.DLL", "windows", "cublas"),  # Windows names are case-insensitive
        ("nvml.dll", "windows", None),
        ("libnvidia-ml.so.1", "linux", None),
        ("libcuda.so.1", "linux", None),
        ("cudnn.lib", "windows", None),
        ("libcudnn_ops.so.9", "linux", "cudnn"),
        # cuSPARSELt (torch's CUDA build, 150 MiB): nvidia/cusparselt/bin, its CUDA 13
        # name since 0.10 (cuda-python's pathfinder knows both)
        ("cusparseLt.dll", "windows", "cusparseLt"),
        ("cusparseLt_13.dll", "windows", "cusparseLt"),
        ("libcusparseLt.so.0", "linux", "cusparse"),
    ],
)
def test_classify(name, platform, group):
    assert cuda_libs.classify(name, platform) == group
