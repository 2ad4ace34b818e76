"""PyInstaller runtime hook: runs in the frozen app before torch is imported.

Windows looks for a DLL's dependencies on the DLL search path, not beside the DLL that
asked; torch and the nvidia wheels normally fix that at import from their install
locations, which a bundle moves. So: add the bundle's torch/lib and every bundled nvidia
library folder with os.add_dll_directory (keeping the handles, which would otherwise
remove the folders again), prepend them to PATH for libraries loaded by name, and drop
CUDA_PATH so an installed CUDA toolkit cannot shadow the bundled libraries. Linux finds
them through the RPATHs PyInstaller keeps: a no-op there. A release's bundle comes in
zip parts (packaging/release_assets.py); one not extracted is said here, by name.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

_DLL_DIRECTORIES: list[Any] = []  # the handles; alive as long as the process
# A release's bundle comes in zip parts (packaging/release_assets.py): the app's part
# lists them all here, and each part brings its marker.
MANIFEST_NAME = "vramgate-parts.json"
MARKERS_FOLDER = "vramgate-parts"


def missing_parts(internal: Path) -> list[str]:
    """The release's zip parts whose files are not here (`internal`: the bundle's
    `_internal`); none where there is no manifest (a bundle built and run in place)."""
    manifest = internal / MANIFEST_NAME
    if not manifest.is_file():
        return []
    parts = json.loads(manifest.read_text(encoding="utf-8"))
    markers = internal / MARKERS_FOLDER
    return [f"{part}.zip" for part in parts if not (markers / f"{part}.txt").is_file()]


def missing_parts_text(missing: list[str]) -> str:
    return (
        f"vramgate is missing part of its files: extract {', '.join(missing)} into the same "
        "folder as the other vramgate zip (each holds a 'vramgate' folder; together they "
        "are the whole program)"
    )


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


if getattr(sys, "frozen", False) and missing_parts(Path(sys._MEIPASS)):
    # before torch fails on a missing DLL: say which zip to extract, in a message box
    # where there is no console (the windowed executable has no stderr)
    _TEXT = missing_parts_text(missing_parts(Path(sys._MEIPASS)))
    if sys.platform == "win32" and sys.stderr is None:
        import ctypes

        ctypes.windll.user32.MessageBoxW(None, _TEXT, "vramgate", 0x10)  # MB_ICONERROR
    raise SystemExit(_TEXT)
if getattr(sys, "frozen", False) and sys.platform == "win32":
    _DLL_DIRECTORIES.extend(
        configure(Path(sys._MEIPASS), sys.platform, os.environ, os.add_dll_directory)
    )
