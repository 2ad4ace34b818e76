"""The tray shows a running image's step, read from a live server's /status through the
tray's own connection: a long image on the simulated text-to-image model (a config
choice), its step advancing in the tooltip and the menu while it runs, gone once done."""

from __future__ import annotations

import re
import threading

import httpx

from app.config.settings import ModelSpec, SimulatedImages
from tests.support.live import wait_until
from tray.monitor import StatusConnection
from tray.view import view_of

STEP = re.compile(r"image (\d+)/60$")


def test_the_tray_follows_a_running_images_steps_simulated(server_factory):
    spec = ModelSpec(name="paint", kind="simulated", images=SimulatedImages(step_ms=200))
    live = server_factory(device="simulated:4GiB", models=(spec,))
    body = {"model": "paint", "prompt": "a harbour", "size": "512x512", "steps": 60}
    answers: list[httpx.Response] = []
    request = threading.Thread(
        target=lambda: answers.append(
            httpx.post(live.url + "/v1/images/generations", json=body, timeout=60)
        )
    )
    connection = StatusConnection(live.url)
    request.start()
    seen: list[int] = []

    def tooltip_step() -> bool:
        view = view_of(connection.fetch())
        found = STEP.search(view.tooltip)
        if found is not None:
            seen.append(int(found.group(1)))
            assert any(line.startswith("paint: image ") for line in view.lines)
        return len(set(seen)) >= 3  # three different steps seen: it moves

    wait_until(tooltip_step, timeout=30, what="the image's steps in the tooltip")
    request.join()
    assert answers[0].status_code == 200
    assert seen == sorted(seen) and 1 <= seen[0] < seen[-1] <= 60
    assert "image" not in view_of(connection.fetch()).tooltip  # done: gone
    connection.close()
