"""The release notes say what was built: every asset's name, size and checksum as the
files have them, the installer first, and the driver the bundled CUDA version needs
(packaging/release_notes.py)."""

from __future__ import annotations

import hashlib

import pytest
from release_notes import main, min_driver, notes


def test_the_notes_list_every_asset_as_built_and_the_minimum_driver(tmp_path):
    assets = {
        "vramgate-0.1.0-windows-cuda-setup.exe": b"MZ" + bytes(3 * 2**20),
        "vramgate-windows-cuda.zip": b"PK" + bytes(1000),
        "SHA256SUMS.txt": b"sums\n",
    }
    for name, data in assets.items():
        (tmp_path / name).write_bytes(data)
    text = notes(tmp_path, ["12.8"])
    assert text.index("`vramgate-0.1.0-windows-cuda-setup.exe` (NVIDIA GPUs)") < text.index(".zip")
    assert "driver 570.65 or newer" in text and "CUDA 12.8" in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == len(assets)
    for name, data in assets.items():
        (row,) = [r for r in rows if r.startswith(f"| `{name}`")]
        assert hashlib.sha256(data).hexdigest() in row
        assert f"{len(data) / 2**20:,.1f} MiB" in row
    assert "runtime" not in text  # no parts that a Windows bundle cannot have


def test_each_installer_is_named_with_the_pcs_it_is_for(tmp_path):
    for flavour in ("cpu", "cuda"):
        (tmp_path / f"vramgate-0.2.0-windows-{flavour}-setup.exe").write_bytes(b"MZ")
    text = notes(tmp_path, [])
    assert "Download `vramgate-0.2.0-windows-cpu-setup.exe` (any PC" in text
    assert "or `vramgate-0.2.0-windows-cuda-setup.exe` (NVIDIA GPUs)" in text
    assert "driver" not in text  # no CUDA version given: no driver to name


def test_an_unknown_cuda_version_stops_the_notes(tmp_path, capsys):
    assert min_driver(["12.8", "12.8"]) == "570.65"
    with pytest.raises(KeyError):
        min_driver(["13.2"])
    assert main([str(tmp_path), "--cuda", "13.2"]) == 1
    assert "no minimum driver known for CUDA 13.2" in capsys.readouterr().err
