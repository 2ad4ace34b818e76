"""The dashboard's image part in headless Chromium against a live server: a running
diffusion batch's step beside its model's state, and its latent preview."""

from __future__ import annotations

import base64
import io
import json
import shutil
import socket

import pytest
from PIL import Image

from app.config.settings import ModelSpec
from tests.support.live import live_server, make_settings, wait_until
from tests.support.random_models import save_random_sd15

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run)")


def test_dashboard_shows_the_running_images_step_and_preview(tmp_path):
    from playwright.sync_api import sync_playwright

    folder = save_random_sd15(tmp_path / "sd15")
    model = ModelSpec(name="sd15", kind="diffusion", path=folder, load="startup")
    settings = make_settings(tmp_path, device="cpu", models=(model,), health_interval=3600)
    with live_server(settings) as live, sync_playwright() as pw:
        host, port = live.url.removeprefix("http://").split(":")
        data = json.dumps(
            {"model": "sd15", "prompt": "a long road", "size": "512x512", "steps": 150}
        ).encode()
        connection = socket.create_connection((host, int(port)))
        connection.sendall(
            f"POST /v1/images/generations HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto(live.url + "/dashboard")
            cell = "#models tbody tr[data-model='sd15'] td:nth-child(3)"
            # polled from here: the page's CSP refuses the eval that Playwright's
            # wait_for_function and evaluate use
            wait_until(lambda: "image " in page.inner_text(cell), 60, "the image's step")
            state = page.inner_text(cell)
            shown = page.locator("#image-previews img")
            wait_until(lambda: shown.count() == 1, 60, "the preview")
            src = shown.get_attribute("src") or ""
        finally:
            browser.close()
            connection.close()
        wait_until(lambda: not live.status()["models"][0]["running"], 60, "the run's end")
    assert src.startswith("data:image/png;base64,"), src[:40]
    with Image.open(io.BytesIO(base64.b64decode(src.partition(",")[2]))) as image:
        assert image.size == (64, 64)  # the latents of a 512² image
    assert state.startswith("ready · image "), state
    step, steps = (int(n) for n in state.removeprefix("ready · image ").split("/"))
    assert 0 < step < steps == 151  # PNDM's timesteps: one more than the steps
