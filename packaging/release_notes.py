"""A release's notes from the assets actually built: each file's name, size and SHA-256,
what to download and run, and the oldest NVIDIA driver the bundled CUDA libraries run
on (from their CUDA version, which the build environment's torch and xllamacpp wheels
were built for).

    python packaging/release_notes.py assets --cuda 12.8 > notes.md

Standard library only; exit status 1 for a CUDA version missing from the table below.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from release_assets import sha256

# The Windows driver each CUDA toolkit version's GA release needs: NVIDIA's CUDA Toolkit
# release notes, table "CUDA Toolkit and Corresponding Driver Versions" (Windows x86_64).
# A version not here stops the notes: add its row from that table.
MIN_WINDOWS_DRIVER = {"12.8": "570.65"}
MiB = 2**20


def min_driver(cuda_versions: list[str]) -> str:
    """The newest of the minimum drivers the bundled CUDA versions need."""
    missing = [v for v in cuda_versions if v not in MIN_WINDOWS_DRIVER]
    if missing:
        raise KeyError(f"no minimum driver known for CUDA {', '.join(missing)}")
    drivers = [MIN_WINDOWS_DRIVER[v] for v in cuda_versions]
    return max(drivers, key=lambda d: tuple(int(p) for p in d.split(".")))


FLAVOURS = {
    "cpu": "any PC: models run on the processor",
    "cuda": "NVIDIA GPUs",
    "": "this build",
}


def flavour_of(installer: str) -> str:
    """`vramgate-<version>-windows-<flavour>-setup.exe`'s flavour (packaging/build_installer.py)."""
    stem = installer.removesuffix("-setup.exe")
    flavour = stem.rpartition("-windows-")[2]
    return flavour if flavour in FLAVOURS else ""


def asset_rows(assets: Path) -> list[str]:
    rows = ["| file | size | SHA-256 |", "|---|---|---|"]
    for path in sorted(p for p in assets.iterdir() if p.is_file()):
        size = path.stat().st_size
        rows.append(f"| `{path.name}` | {size / MiB:,.1f} MiB | `{sha256(path)}` |")
    return rows


def notes(assets: Path, cuda_versions: list[str]) -> str:
    names = sorted(p.name for p in assets.iterdir() if p.is_file())
    installers = [n for n in names if n.endswith("-setup.exe")]
    zips = [n for n in names if n.endswith(".zip")]
    paragraphs = ["## Windows"]
    if installers:
        which = " or ".join(f"`{name}` ({FLAVOURS[flavour_of(name)]})" for name in installers)
        paragraphs.append(
            f"Download {which} and run it: it installs for you alone into "
            "`%LOCALAPPDATA%\\Programs\\vramgate`, with no administrator rights, a Start menu "
            "entry and an entry in Settings > Apps to uninstall it (your models and logs are "
            "kept unless you ask)."
        )
    if zips:
        paragraphs.append(
            ("Or, without installing: " if installers else "")
            + f"download every .zip ({', '.join(f'`{z}`' for z in zips)}), extract them all "
            "into one folder (each holds a `vramgate` folder; together they are the program) "
            "and run `vramgate\\vramgate.exe`."
        )
    if cuda_versions:
        paragraphs.append(
            f"NVIDIA GPUs: driver {min_driver(cuda_versions)} or newer (the bundled CUDA "
            f"{', '.join(cuda_versions)} libraries need it; CUDA itself is inside). Without "
            "an NVIDIA driver, GGUF models run on llama.cpp's CPU build, which is inside too."
        )
    paragraphs.append("Check the downloads against `SHA256SUMS.txt` or this table:")
    paragraphs.append("\n".join(asset_rows(assets)))
    return "\n\n".join(paragraphs) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assets", type=Path, help="the folder of the release's files")
    parser.add_argument("--cuda", action="append", default=[], help="a bundled CUDA version")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(notes(args.assets, args.cuda))
    except KeyError as error:
        print(f"release notes FAILED: {error.args[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
