"""The watchdog, against the simulated device and a simulated model that hangs on a chosen
call: the caller gets 504 and the permit comes back, /health turns unhealthy, and a
thread that stays away ends the process (exit 76) for the supervisor to restart."""

from __future__ import annotations

import sys

import httpx

from app.config.settings import FaultInjection, ModelSpec, SimulatedBucket
from app.errors import EXIT_WEDGED
from tests.support.live import ServerProcess, clean_env, wait_until
from tray.supervisor import RestartPolicy

MiB = 2**20


def hanging(hang_ms: float) -> ModelSpec:
    # Call 1 is the warm-up; call 2 is the first request.
    return ModelSpec(
        name="sim",
        kind="simulated",
        buckets=(SimulatedBucket(size=64, bytes=100 * MiB, run_ms=1),),
        inject=FaultInjection(hang_on_calls=(2,), hang_ms=hang_ms),
    )


def test_simulated_hung_job_gets_504_its_permit_back_and_health_goes_bad(server_factory):
    live = server_factory(
        device="simulated:1GiB", models=(hanging(4000),), run_timeout=0.5, health_interval=3600
    )
    r = httpx.post(live.url + "/v1/embeddings", json={"model": "sim", "input": "x"}, timeout=30)
    assert r.status_code == 504 and r.json()["error"]["code"] == "run_timeout"
    assert int(r.headers["Retry-After"]) >= 1
    status = live.status()
    assert status["pool"]["admitted_bytes"] == 0 and status["queue"]["running"] == 0
    assert httpx.get(live.url + "/health").status_code == 503
    # Still away after another run_timeout: the service asks the process to end.
    wait_until(lambda: live.fatal_calls, 10, "the wedged exit")
    assert live.service.state.exit_code == EXIT_WEDGED


def test_simulated_job_back_in_time_clears_the_wedge(server_factory):
    live = server_factory(
        device="simulated:1GiB", models=(hanging(800),), run_timeout=0.5, health_interval=3600
    )
    r = httpx.post(live.url + "/v1/embeddings", json={"model": "sim", "input": "x"}, timeout=30)
    assert r.status_code == 504
    wait_until(lambda: not live.service.scheduler.wedged, 10, "the thread back")
    assert not live.fatal_calls
    ok = httpx.post(live.url + "/v1/embeddings", json={"model": "sim", "input": "x"}, timeout=30)
    assert ok.status_code == 200


def test_simulated_wedged_server_process_exits_76_and_the_policy_restarts_it(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(
        'device = "simulated:1GiB"\nrun_timeout = 0.5\nhealth_interval = 3600\n'
        '[[models]]\nname = "sim"\nkind = "simulated"\n'
        'buckets = [{size = 64, bytes = "100MiB", run_ms = 1}]\n'
        "inject = {hang_on_calls = [2], hang_ms = 600000}\n"
    )
    server = ServerProcess(
        [sys.executable, "-m", "app", "serve", "--config", str(config),
         "--data-dir", str(tmp_path / "d"), "--log-dir", str(tmp_path / "l")],
        clean_env(),
    )  # fmt: skip
    server.wait_ready(120)
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "sim", "input": "x"}, timeout=30)
    assert r.status_code == 504
    assert server.process.wait(60) == EXIT_WEDGED  # although the thread still sleeps
    decision = RestartPolicy().decide(EXIT_WEDGED, uptime_s=120)
    assert decision.restart and decision.delay_s == 0


def test_simulated_long_job_that_reports_its_steps_is_not_given_up_on(server_factory):
    """A job of many steps (a long audio's windows, a diffusion's denoising) that runs
    three times `run_timeout` but reports each step is no wedge: 200, nothing overdue.
    The same job without steps is a 504 (the hung job above)."""
    stepped = ModelSpec(
        name="sim",
        kind="simulated",
        buckets=(SimulatedBucket(size=64, bytes=100 * MiB, run_ms=1500, steps=15, warm=False),),
    )
    live = server_factory(
        device="simulated:1GiB", models=(stepped,), run_timeout=0.5, health_interval=3600
    )
    r = httpx.post(live.url + "/v1/embeddings", json={"model": "sim", "input": "x"}, timeout=30)
    assert r.status_code == 200, r.text
    assert float(r.headers["X-Vramgate-Run-Ms"]) >= 1500
    assert not live.service.scheduler.wedged
