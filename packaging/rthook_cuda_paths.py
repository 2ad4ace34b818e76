"""PyInstaller runtime hook: runs in the frozen app before torch is imported.

Windows looks for a DLL's dependencies on the DLL search path, not beside the DLL that
asked; torch and the nvidia wheels normally fix that at import from their install
locations, which a bundle moves. So: add the bundle's torch/lib and every bundled nvidia
library folder with os.add_dll_directory (keeping the handles, which would otherwise
remove the folders again), prepend them to PATH for libraries loaded by name, and drop
CUDA_PATH so an installed CUDA toolkit cannot shadow the bundled libraries. Linux finds
them through the RPATHs PyInstaller keeps: a no-op there.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

_DLL_DIRECTORIES: list[Any] = []  # the handles; alive as long as the process


def library_folders(root: Path) -> list[Path]:
    folders = [root / "torch" / "lib"] if (root / "torch" / "lib").is_dir() else []
    nvidia = root / "nvidia"
    if nvidia.is_dir():
        folders += sorted({dll.parent for dll in nvidia.rglob("*.dll")})
    return folders


def configure(
    root: Path,
    platform: str,
    environ: MutableMapping[str, str],
    add_dll_directory: Callable[[str], Any],
) -> list[Any]:
    if platform != "win32":
        return []
    for name in [k for k in environ if k.upper().startswith("CUDA_PATH")]:
        del environ[name]
    folders = library_folders(root)
    handles = [add_dll_directory(str(folder)) for folder in folders]
    environ["PATH"] = os.pathsep.join([*map(str, folders), environ.get("PATH", "")])
    return handles


if getattr(sys, "frozen", False) and sys.platform == "win32":
    _DLL_DIRECTORIES.extend(
        configure(Path(sys._MEIPASS), sys.platform, os.environ, os.add_dll_directory)
    )
