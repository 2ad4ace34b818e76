"""A config read again (`vramgate pull`, `rm`, an edit) while a changed model is busy: the
answer says which changed models take their new entry now and which once their running
requests end; the running request finishes on the old entry and the next one gets the
new. Simulated models (a config choice), a real server over real HTTP."""

from __future__ import annotations

import threading

import httpx
import pytest

from app.config.settings import ConfigSource
from tests.support.live import live_server, wait_until

MODEL = """
[[models]]
name = "{name}"
kind = "simulated"
weights = "{weights}"
[[models.buckets]]
size = 16
bytes = "10MiB"
run_ms = {run_ms}
"""


def config_text(tmp_path, weights: str) -> str:
    head = f'device = "simulated:4GiB"\nport = 0\ndata_dir = "{tmp_path}/d"\n'
    head += f'log_dir = "{tmp_path}/l"\n'
    busy = MODEL.format(name="busy", weights=weights, run_ms=4000)
    idle = MODEL.format(name="idle", weights=weights, run_ms=1)
    return head + busy + idle


def weights_of(live, name: str) -> int:
    return next(m for m in live.status()["models"] if m["name"] == name)["weights_bytes"]


@pytest.mark.slow
def test_simulated_reread_says_which_changed_models_take_their_new_settings_now(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(config_text(tmp_path, "100MiB"))
    source = ConfigSource(config)
    with live_server(source.settings(), models_source=source) as live:
        http = httpx.Client(base_url=live.url, timeout=60)
        for name in ("busy", "idle"):  # both loaded with their first entry
            answer = http.post("/v1/embeddings", json={"model": name, "input": "w"})
            assert answer.status_code == 200, answer.text
        assert weights_of(live, "busy") == weights_of(live, "idle") == 100 * 2**20
        answers: list[httpx.Response] = []

        def ask_busy() -> None:
            body = {"model": "busy", "input": "w"}
            answers.append(httpx.post(live.url + "/v1/embeddings", json=body, timeout=60))

        running = threading.Thread(target=ask_busy)
        running.start()
        wait_until(lambda: live.status()["queue"]["running"] == 1, 30, "the busy model runs")

        config.write_text(config_text(tmp_path, "200MiB"))
        changes = http.post("/admin/models/reread").json()
        assert changes["changed"] == ["busy", "idle"]
        assert changes["changed_now"] == ["idle"]
        assert changes["changed_when_idle"] == ["busy"]
        # asked while the old entry still runs: it waits for the new one, which serves it
        # (were it queued on the old entry, a steady flow would keep the old settings)
        follower = threading.Thread(target=ask_busy)
        follower.start()
        running.join(60)
        follower.join(60)
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        row = next(m for m in live.status()["models"] if m["name"] == "busy")
        assert (row["state"], row["weights_bytes"]) == ("ready", 200 * 2**20)
        answer = http.post("/v1/embeddings", json={"model": "idle", "input": "w"})
        assert answer.status_code == 200, answer.text
        assert weights_of(live, "idle") == 200 * 2**20

        # nothing changed: an empty answer, nothing retired
        changes = http.post("/admin/models/reread").json()
        assert changes["changed"] == changes["changed_now"] == changes["changed_when_idle"] == []
        http.close()
