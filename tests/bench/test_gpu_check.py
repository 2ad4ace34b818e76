"""bench/gpu_check.py as a dry run on the CPU: the script a GPU session runs must run end
to end, and its generation, SD 1.5 and speech sections must report what the issues ask of
them (on the CPU the peaks are the resident set's, so no ratio is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.live import clean_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_dry_run_on_the_cpu_reports_generation(tmp_path):
    result = subprocess.run(
        [
            sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu",
            "--hidden", "64", "--layers", "1", "--requests", "16", "--clients", "4",
            "--gen-tokens", "40", "--tiny", "--sd-sizes", "64,128", "--sd-steps", "2",
            "--out", str(tmp_path),
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
    seen = report["vision_language"]
    assert seen["status"] == [200, 200] and seen["same_answer"]
    assert any(line["bucket"].endswith("+images") for line in seen["lines"])
    sizes = report["sd15"]["sizes"]
    assert [row["bucket"] for row in sizes] == ["px64x64xb1", "px128x128xb1"]
    for row in sizes:  # a quote, a learned price from 3 runs, an isolated peak
        assert row["first_quote_bytes"] > 0 and row["learned_bytes"] > 0
        assert row["samples"] >= 3 and row["isolated_peak_bytes"] >= 0
        assert row["isolated_max_allocated_bytes"] is None  # CUDA's figure; not on the CPU
    window = report["speech_window"]
    assert window["status"] == [200, 200, 200] and window["bucket"] == "w30xb1"
    assert window["learned_bytes"] > 0 and window["samples"] >= 3
    spoken = report["speech_synthesis"]
    assert spoken["status"] == [200, 200, 200] and spoken["bucket"].startswith("s")
    # a tiny VITS may grow the resident set by nothing: a learned price of 0 on the CPU
    assert spoken["learned_bytes"] is not None and spoken["samples"] >= 3
    assert spoken["audio_seconds"] > 0.5 and spoken["isolated_peak_bytes"] >= 0


def test_the_flood_limits_the_card_itself_and_the_server_sees_the_limit(tmp_path):
    """On a 139 GiB GPU a pool shrunk by the server's own arithmetic (a larger reserve)
    cannot run out for real: nothing stops torch taking more. The check sets torch's
    per-process memory fraction, so the allocator itself refuses past the limit (see
    tests/engine/fake_cuda for torch's rule); the server must see that limit too, or it
    admits more than the card may give and its '0 OOM' fails for the wrong reason."""
    from bench.gpu_check import limit_memory
    from tests.core.lifecycle.test_cache_return import _lane
    from tests.support.fake_cuda import CachingCuda

    gib = 2**30
    card = CachingCuda(total=139 * gib)
    lane = _lane(tmp_path, card, [0.0])
    reserve = lane.memory.reserve
    weights = card.alloc(3 * gib)  # a model's weights: the pool is above them
    lane.memory.baseline = card.allocated
    limit_memory(lane, 4 * gib, cuda=card)
    assert lane.memory.reserve == reserve  # the reserve for other programs is as it was
    assert 0 < card.fraction < 0.1
    lane.memory.snapshot(fresh=True)
    # within the bytes a float's fraction of 139 GiB rounds away
    assert abs(lane.memory.pool_bytes() - 4 * gib) <= 1024
    assert abs(lane.memory.capacity_bytes() - 4 * gib) <= 1024
    card.free(weights)
