"""A bundle as release assets under GitHub's 2 GiB per asset (packaging/release_assets.py),
on a fake bundle with a budget scaled down to kilobytes."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import release_assets
from release_assets import write_assets
from rthook_cuda_paths import missing_parts

from tests.packaging.test_cuda_libs import tree

ROOT = Path(__file__).resolve().parents[2]


def fake_cuda_bundle(tmp_path: Path) -> Path:
    bundle = tmp_path / "dist" / "vramgate"
    tree(
        bundle,
        {
            "": ["vramgate.exe", "vramgate-cli.exe"],
            "_internal/torch/lib": ["torch_cuda.dll", "c10.dll"],
            "_internal/nvidia/cublas/bin": ["cublas64_12.dll", "cublasLt64_12.dll"],
            "_internal/nvidia/cudnn/bin": ["cudnn64_9.dll", "cudnn_ops64_9.dll"],
            "_internal/nvidia/cusparselt/bin": ["cusparseLt.dll"],
        },
    )
    for n, path in enumerate(sorted(p for p in bundle.rglob("*") if p.is_file())):
        path.write_bytes(os.urandom(3000 + 1000 * n))  # incompressible, as DLLs nearly are
    return bundle


def test_parts_stay_under_the_budget_and_together_are_the_bundle(tmp_path):
    bundle = fake_cuda_bundle(tmp_path)
    out = tmp_path / "assets"
    assets = write_assets(bundle, out, "vramgate-windows-cuda", budget=12_000)
    names = [a.name for a in assets]
    assert names[0] == "vramgate-windows-cuda.zip" and names[-1] == "SHA256SUMS.txt"
    runtime = [n for n in names if "-runtime-" in n]
    assert len(runtime) >= 2  # the runtime took more than one part at this budget
    for asset in assets[:-1]:
        with zipfile.ZipFile(asset) as archive:
            members = archive.namelist()
        assert all(m.startswith("vramgate/") for m in members)
        if "-runtime-" in asset.name:  # the CUDA runtime apart from the app
            assert all("/_internal/nvidia/" in m or "/vramgate-parts/" in m for m in members)
        # a part is closed before the next file could pass the budget: at most one file
        # (and its marker) past it, where that file alone is bigger than the budget
        assert asset.stat().st_size < 12_000 + 16_000
    # Extracted into one folder, every part together is the bundle, byte for byte.
    merged = tmp_path / "merged"
    for asset in assets[:-1]:
        with zipfile.ZipFile(asset) as archive:
            archive.extractall(merged)
    files = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    for relative in files:
        assert (merged / "vramgate" / relative).read_bytes() == (bundle / relative).read_bytes()
    internal = merged / "vramgate" / "_internal"
    assert missing_parts(internal) == []
    manifest = json.loads((internal / "vramgate-parts.json").read_text())
    assert [f"{part}.zip" for part in manifest] == names[:-1]
    # One part left out is named by the app at start.
    (internal / "vramgate-parts" / f"{Path(runtime[-1]).stem}.txt").unlink()
    assert missing_parts(internal) == [runtime[-1]]
    # The checksums are sha256sum's lines.
    sums = (out / "SHA256SUMS.txt").read_text().splitlines()
    assert sums == [f"{hashlib.sha256(a.read_bytes()).hexdigest()}  {a.name}" for a in assets[:-1]]


def test_the_script_prints_the_sizes_and_checks_the_limit(tmp_path):
    bundle = fake_cuda_bundle(tmp_path)
    done = subprocess.run(
        [sys.executable, "packaging/release_assets.py", str(bundle), str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["limit"] == 2 * 2**30
    assert set(printed["assets"]) == {
        "vramgate-windows-cuda.zip",
        "vramgate-windows-cuda-runtime-1.zip",
        "SHA256SUMS.txt",
    }
    assert all(0 < size < printed["limit"] for size in printed["assets"].values())


def test_a_part_at_or_past_the_limit_fails_the_script_naming_it(tmp_path, monkeypatch, capsys):
    """GitHub takes a release file only *under* 2 GiB: with the limit scaled down to
    kilobytes, parts past it, or exactly at it, make the script exit 1 naming each; one
    byte more and it passes."""
    bundle = fake_cuda_bundle(tmp_path)
    assert release_assets.main([str(bundle), str(tmp_path / "sized")]) == 0
    sizes: dict[str, int] = json.loads(capsys.readouterr().out)["assets"]
    biggest = max(sizes, key=lambda name: sizes[name])
    zips = sorted(name for name in sizes if name.endswith(".zip"))
    for limit, named in [(4_000, zips), (sizes[biggest], [biggest]), (sizes[biggest] + 1, [])]:
        monkeypatch.setattr(release_assets, "GITHUB_ASSET_LIMIT", limit)
        status = release_assets.main([str(bundle), str(tmp_path / f"out-{limit}")])
        printed, said = capsys.readouterr()
        assert json.loads(printed) == {"assets": sizes, "limit": limit}  # the same parts
        assert status == (1 if named else 0), (limit, said)
        if named:
            assert said.startswith("release assets FAILED: over GitHub's 2 GiB limit")
            assert sorted(ast.literal_eval(said.split("limit: ", 1)[1])) == named
        else:
            assert said == ""
