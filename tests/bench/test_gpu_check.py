"""bench/gpu_check.py as a dry run on the CPU: the script a GPU session runs must run end
to end, and its generation section must report what the issue asks of it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import clean_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_dry_run_on_the_cpu_reports_generation(tmp_path):
    result = subprocess.run(
        [
            sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu",
            "--hidden", "64", "--layers", "1", "--requests", "16", "--clients", "4",
            "--gen-tokens", "40", "--out", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=600, env=clean_env(), cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    generation = report["generation"]
    concurrent = generation["concurrent"]
    assert concurrent["max_running"] >= 1 and len(concurrent["admissions"]) == 4
    assert {a["x-vramgate-price-source"] for a in concurrent["admissions"]} <= {
        "learned",
        "learned_rate",
        "geometry",
    }
    priced = generation["price_vs_isolated"]
    assert priced["price_bytes"] > 0 and priced["bucket"].startswith("p")
    # hidden 64, 1 head of 64, 1 KV head, 1 layer, float32: 2 × 1 × 1 × 64 × 4 bytes
    assert {line["per_token_bytes"] for line in generation["lines"]} == {512}
    assert report["flood"]["ooms"] == 0
