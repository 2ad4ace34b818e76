"""The Windows installer, `vramgate-<version>-windows-<flavour>-setup.exe`, from a bundle:
runs `makensis` on packaging/installer.nsi (Debian's nsis on Linux, NSIS's own on the
Windows runner) with the version, the bundle, and the list of the bundle's top-level
entries the uninstaller removes (never the whole install folder: a person may have chosen
one that holds other things).

    python packaging/build_installer.py dist/vramgate assets [--sign "signtool sign ... %1"]

`--sign` (passed by the workflow only where a certificate secret exists) is a command
NSIS runs on the uninstaller and on the finished installer, "%1" standing for the file
(packaging/README.md, "Signing"). Prints the installer's name and size as one JSON line.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "installer.nsi"
NSIS_LIMIT = 2**31  # bytes: makensis refuses an installer's data past 2 GB (32-bit offsets)


def app_version(root: Path = HERE.parent) -> str:
    text = (root / "app" / "__init__.py").read_text(encoding="utf-8")
    return text.split('__version__ = "')[1].split('"')[0]


def installer_name(version: str, flavour: str) -> str:
    return f"vramgate-{version}-windows-{flavour}-setup.exe"


def bundle_list(bundle: Path) -> str:
    """An NSIS include: the macro that removes what the bundle put at the top of the
    install folder (its executables and `_internal`), and nothing else."""
    lines = ["!macro REMOVE_BUNDLE"]
    for entry in sorted(bundle.iterdir()):
        if '"' in entry.name or "$" in entry.name:
            raise ValueError(f"a name NSIS cannot quote: {entry.name!r}")
        if entry.is_dir():
            lines.append(f'  RMDir /r "$INSTDIR\\{entry.name}"')
        else:
            lines.append(f'  Delete "$INSTDIR\\{entry.name}"')
    return "\n".join([*lines, "!macroend", ""])


def makensis_command(
    makensis: str,
    *,
    version: str,
    bundle: Path,
    listing: Path,
    out: Path,
    icon: Path | None = None,
    sign: str | None = None,
    target: str | None = None,
) -> list[str]:
    defines = {
        "VERSION": version,
        "BUNDLE": str(bundle),
        "BUNDLE_LIST": str(listing),
        "OUTFILE": str(out),
    }
    if icon is not None:
        defines["ICON"] = str(icon)
    if sign:
        defines["SIGN"] = sign
    if target:
        defines["TARGET"] = target
    # -INPUTCHARSET: the script is UTF-8 (NSIS on Windows would read it as the ANSI page)
    return [
        makensis,
        "-V2",
        "-INPUTCHARSET",
        "UTF8",
        *(f"-D{name}={value}" for name, value in defines.items()),
        str(SCRIPT),
    ]


def build_installer(
    bundle: Path,
    out_dir: Path,
    *,
    flavour: str = "cuda",
    version: str | None = None,
    icon: Path | None = None,
    sign: str | None = None,
    makensis: str | None = None,
    target: str | None = None,
) -> Path:
    """Builds the installer into `out_dir`; its path."""
    found = makensis or shutil.which("makensis")
    if found is None:
        raise RuntimeError("makensis not found: install NSIS (Debian: apt-get install nsis)")
    version = version or app_version()
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir.resolve() / installer_name(version, flavour)
    with tempfile.TemporaryDirectory() as work:
        listing = Path(work) / "bundle_list.nsh"
        listing.write_text(bundle_list(bundle), encoding="utf-8")
        command = makensis_command(
            found,
            version=version,
            bundle=bundle.resolve(),
            listing=listing,
            out=out,
            icon=icon,
            sign=sign,
            target=target,
        )
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"makensis failed ({done.returncode}): {done.stdout}{done.stderr}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="the built folder (dist/vramgate)")
    parser.add_argument("out", type=Path, help="where the installer goes")
    parser.add_argument("--flavour", default="cuda")
    parser.add_argument("--icon", type=Path)
    parser.add_argument("--sign", help='a command that signs "%%1" in place')
    parser.add_argument("--target", help="NSIS's stub: amd64-unicode (default), x86-unicode")
    args = parser.parse_args(argv)
    try:
        installer = build_installer(
            args.bundle,
            args.out,
            flavour=args.flavour,
            icon=args.icon,
            sign=args.sign,
            target=args.target,
        )
    except (RuntimeError, OSError, ValueError) as error:
        print(f"installer FAILED: {error}", file=sys.stderr)
        return 1
    size = installer.stat().st_size
    print(json.dumps({"installer": installer.name, "bytes": size, "nsis_limit": NSIS_LIMIT}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
