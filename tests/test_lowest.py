"""The constraints CI installs to test pyproject's lower bounds (.ci/lowest.py)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TWO_PART_RELEASES = {"packaging"}  # numbered YY.N: its release is "24.0" itself


def test_every_dependency_but_torch_is_pinned_to_its_lower_bound():
    done = subprocess.run(
        [sys.executable, ".ci/lowest.py"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    pins = dict(line.split("==", 1) for line in done.stdout.splitlines())
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert len(pins) == len(dependencies) - 1 and "torch" not in pins
    assert pins["transformers"] == "5.0.0" and pins["uvicorn"] == "0.29.0"  # extras dropped
    for name, version in pins.items():  # each a real release: == pads nothing away
        assert version.count(".") >= 2 or name in TWO_PART_RELEASES, version
