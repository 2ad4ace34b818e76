"""Which CUDA libraries a vramgate bundle must carry, and where they go.

Pure: no torch, no PyInstaller; the target platform is an argument, so every layout is
tested on any machine with fake trees. CUDA loads many of these on demand (cuDNN's
sub-libraries, nvrtc, nvJitLink), which PyInstaller's import analysis cannot see.

Layouts found in site-packages:
- torch's own `torch/lib` (older Windows wheels carry cuBLAS and cuDNN there);
- per-package nvidia wheels (cu12): `nvidia/<pkg>/bin/*.dll`, `nvidia/<pkg>/lib/*.so*`;
- the shared cu13 folder: `nvidia/cu13/bin/x86_64/*.dll`, `nvidia/cu13/lib/*.so*`
  (cuDNN keeps its own `nvidia/cudnn/...` folder).
Destination folders keep the package-relative path, so the runtime hook finds them where
torch expects them. Never the driver (it belongs to the user's machine), never import
libraries, static archives or headers.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

Platform = Literal["windows", "linux"]

# (group, pattern) per platform; a group names what the build-output check requires.
WINDOWS_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("cublasLt", "cublasLt64_*.dll"),
    ("cublas", "cublas64_*.dll"),
    ("cudnn", "cudnn*64_*.dll"),
    ("cudart", "cudart64_*.dll"),
    ("nvrtc", "nvrtc*.dll"),
    ("nvjitlink", "nvJitLink*.dll"),
    ("cufft", "cufft*64_*.dll"),
    ("curand", "curand64_*.dll"),
    ("cusolver", "cusolver*64_*.dll"),
    ("cusparseLt", "cusparseLt*.dll"),  # cusparseLt.dll; cusparseLt_13.dll (CUDA 13)
    ("cusparse", "cusparse*64_*.dll"),
    ("cupti", "cupti64_*.dll"),
    ("nvtx", "nvToolsExt64_*.dll"),
    ("caffe2_nvrtc", "caffe2_nvrtc.dll"),
    ("zlib", "zlibwapi.dll"),  # cuDNN 8 needs it
)
LINUX_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("cublasLt", "libcublasLt.so*"),
    ("cublas", "libcublas.so*"),
    ("cudnn", "libcudnn*.so*"),
    ("cudart", "libcudart.so*"),
    ("nvrtc", "libnvrtc*.so*"),
    ("nvjitlink", "libnvJitLink.so*"),
    ("cufft", "libcufft*.so*"),
    ("curand", "libcurand.so*"),
    ("cusolver", "libcusolver*.so*"),
    ("cusparse", "libcusparse*.so*"),
    ("cupti", "libcupti.so*"),
    ("nvtx", "libnvToolsExt.so*"),
    ("nccl", "libnccl.so*"),
    ("nvshmem", "libnvshmem*.so*"),
    ("cufile", "libcufile*.so*"),
)
DRIVER_PATTERNS: dict[Platform, tuple[str, ...]] = {
    "windows": ("nvcuda.dll", "nvml.dll", "nvapi*.dll", "nvfatbinaryloader.dll"),
    "linux": ("libcuda.so*", "libnvidia-*.so*", "libnvcuvid.so*"),
}
NEVER_SUFFIXES = (".lib", ".a", ".h", ".hpp", ".cuh", ".def", ".exp")
# What a CUDA bundle cannot run without.
REQUIRED_GROUPS = ("cublas", "cublasLt", "cudart", "cudnn")

SEARCH_FOLDERS: dict[Platform, tuple[str, ...]] = {
    "windows": ("torch/lib", "nvidia/*/bin", "nvidia/cu13/bin/x86_64"),
    "linux": ("torch/lib", "nvidia/*/lib", "nvidia/cu13/lib"),
}


@dataclass(frozen=True)
class Library:
    source: Path
    dest: str  # the folder inside the bundle, relative to its root (POSIX separators)
    group: str

    @property
    def name(self) -> str:
        return self.source.name


def classify(name: str, platform: Platform) -> str | None:
    """The library group of a file name, or None if the bundle must not carry it."""
    if name.endswith(NEVER_SUFFIXES) or is_driver(name, platform):
        return None
    table = WINDOWS_LIBRARIES if platform == "windows" else LINUX_LIBRARIES
    folded = name.lower() if platform == "windows" else name
    for group, pattern in table:
        wanted = pattern.lower() if platform == "windows" else pattern
        if fnmatch.fnmatchcase(folded, wanted):
            return group
    return None


def is_driver(name: str, platform: Platform) -> bool:
    folded = name.lower() if platform == "windows" else name
    return any(
        fnmatch.fnmatchcase(folded, p.lower() if platform == "windows" else p)
        for p in DRIVER_PATTERNS[platform]
    )


def select_libraries(site_packages: Path, platform: Platform) -> list[Library]:
    """Every CUDA library under `site_packages` that a bundle for `platform` needs."""
    chosen: dict[tuple[str, str], Library] = {}
    for folder_glob in SEARCH_FOLDERS[platform]:
        for folder in sorted(site_packages.glob(folder_glob)):
            if not folder.is_dir():
                continue
            dest = PurePosixPath(*folder.relative_to(site_packages).parts).as_posix()
            for path in sorted(folder.iterdir()):
                group = classify(path.name, platform)
                if group is not None and path.is_file():
                    chosen[(dest, path.name)] = Library(path, dest, group)
    return sorted(chosen.values(), key=lambda lib: (lib.dest, lib.name))


def missing_groups(libraries: list[Library]) -> list[str]:
    present = {lib.group for lib in libraries}
    return [group for group in REQUIRED_GROUPS if group not in present]


def library_folders(libraries: list[Library]) -> list[str]:
    """The bundle folders the runtime hook must put on the DLL search path."""
    return sorted({lib.dest for lib in libraries})
