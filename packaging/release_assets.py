"""A built bundle as release assets that each fit GitHub's 2 GiB limit per asset, with
their SHA-256 checksums.

The CUDA bundle is about 3 GiB compressed (torch's CUDA libraries alone are 1.5 GiB:
packaging/README.md), and PowerShell's Compress-Archive fails past 2 GB. So the folder
is written as zip parts: `vramgate-windows-cuda.zip` holds the app (everything but the
CUDA runtime: `_internal/nvidia/`; where the app passes the budget, its rest is
`vramgate-windows-cuda-app-2.zip`, ...), `vramgate-windows-cuda-runtime-1.zip`, `-2`, ...
the CUDA runtime, each part under the limit. Every part's paths start at `vramgate/`, so
extracting all of them into one folder gives the bundle whole. Each part carries a
marker, `_internal/vramgate-parts/<part>.txt`, and the app's part lists them all in
`_internal/vramgate-parts.json`: the app checks at start that every part is there
(`rthook_cuda_paths.missing_parts`) and says which to extract if not.
`SHA256SUMS.txt` lists every asset as `sha256sum -c` reads it. Prints one JSON line
with each asset's size; exit status 1 if one would pass the limit (checked in CI).

    python packaging/release_assets.py dist/vramgate assets --name vramgate-windows-cuda

Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zipfile
from pathlib import Path, PurePosixPath

from rthook_cuda_paths import MANIFEST_NAME, MARKERS_FOLDER

GITHUB_ASSET_LIMIT = 2 * 2**30  # bytes (docs: "each file included in a release")
PART_BUDGET = 1900 * 2**20  # a part is closed before it could pass this
RUNTIME_FOLDER = "_internal/nvidia"  # the CUDA runtime: rthook_cuda_paths.py finds it
PARTS_MANIFEST = f"_internal/{MANIFEST_NAME}"
MARKERS = f"_internal/{MARKERS_FOLDER}"


def runtime_file(relative: PurePosixPath) -> bool:
    return str(relative).startswith(RUNTIME_FOLDER + "/")


class PartWriter:
    """Zip parts named `<name>-<n>.zip` (the first of the app: `<name>.zip`), each closed
    before its next file could take it past `budget` (a file is stored compressed, or
    stored as it is where deflate would not shrink it)."""

    def __init__(self, out: Path, stem: str, budget: int) -> None:
        self.out, self.stem, self.budget = out, stem, budget
        self.parts: list[Path] = []
        self._zip: zipfile.ZipFile | None = None

    def add(self, source: Path, arcname: str) -> None:
        size = source.stat().st_size
        if self._zip is not None and self._written() + size > self.budget:
            self.close()
        if self._zip is None:
            self._open()
        assert self._zip is not None
        self._zip.write(source, arcname, compress_type=zipfile.ZIP_DEFLATED)

    def _written(self) -> int:
        assert self._zip is not None and self._zip.fp is not None
        return self._zip.fp.tell()

    def _open(self) -> None:
        path = self.out / f"{self.stem}-{len(self.parts) + 1}.zip"
        self.parts.append(path)
        self._zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, allowZip64=True)

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._zip = None


def write_assets(bundle: Path, out: Path, name: str, budget: int = PART_BUDGET) -> list[Path]:
    """The bundle folder as zip parts in `out` and SHA256SUMS.txt; the assets' paths."""
    out.mkdir(parents=True, exist_ok=True)
    root = bundle.name
    files = sorted(p for p in bundle.rglob("*") if p.is_file())
    app = PartWriter(out, f"{name}-app", budget)
    runtime = PartWriter(out, f"{name}-runtime", budget)
    for path in files:
        relative = PurePosixPath(path.relative_to(bundle).as_posix())
        (runtime if runtime_file(relative) else app).add(path, f"{root}/{relative}")
    app.close()
    runtime.close()
    if not app.parts:
        raise RuntimeError(f"{bundle} has no files outside {RUNTIME_FOLDER}")
    first = app.parts[0].rename(out / f"{name}.zip")  # the one a person sees first
    parts = [first, *app.parts[1:], *runtime.parts]
    for part in parts:
        with zipfile.ZipFile(part, "a") as archive:
            archive.writestr(f"{root}/{MARKERS}/{part.stem}.txt", part.name + "\n")
    with zipfile.ZipFile(first, "a") as archive:
        archive.writestr(f"{root}/{PARTS_MANIFEST}", json.dumps([p.stem for p in parts]))
    sums = out / "SHA256SUMS.txt"
    sums.write_text("".join(f"{sha256(p)}  {p.name}\n" for p in parts), encoding="utf-8")
    return [*parts, sums]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="the built folder (dist/vramgate)")
    parser.add_argument("out", type=Path, help="where the assets go")
    parser.add_argument("--name", default="vramgate-windows-cuda")
    args = parser.parse_args(argv)
    try:
        assets = write_assets(args.bundle, args.out, args.name)
    except (RuntimeError, OSError) as error:
        print(f"release assets FAILED: {error}", file=sys.stderr)
        return 1
    sizes = {asset.name: asset.stat().st_size for asset in assets}
    print(json.dumps({"assets": sizes, "limit": GITHUB_ASSET_LIMIT}))
    over = [name for name, size in sizes.items() if size >= GITHUB_ASSET_LIMIT]
    if over:
        print(f"release assets FAILED: over GitHub's 2 GiB limit: {over}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
