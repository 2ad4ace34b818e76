"""The dashboard's Models view in headless Chromium: "Fits?" beside Pull lists each
quantisation of a Hub repo (the loopback Hub holding SmolLM2's GGUF) with where it fits
on the simulated GPU now, and a model that loads for seconds shows its phase and seconds
in its state; a screenshot of both in the test's folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.config.settings import ConfigSource
from tests.support.hub import Hub
from tests.support.live import live_server, make_settings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REPO = "Org/Smol-GGUF"
SMOL = "SmolLM2-135M-Instruct-Q4_1.gguf"

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run)")


def test_fits_and_a_load_in_progress_on_the_models_view(smollm2_gguf, tmp_path, monkeypatch):
    from huggingface_hub import constants
    from playwright.sync_api import expect, sync_playwright

    config = tmp_path / "config.toml"
    config.write_text(
        '[[models]]\nname = "slow"\nkind = "simulated"\nload_ms = 4000\nload = "demand"\n'
    )
    source = ConfigSource(config, {"device": "simulated:512MiB", "models_dir": tmp_path / "m"})
    settings = make_settings(tmp_path, device="simulated:512MiB", models=source.settings().models)
    with Hub() as hub, live_server(settings, models_source=source) as live, sync_playwright() as pw:
        hub.add(REPO, {SMOL: smollm2_gguf.read_bytes()})
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)  # as HF_ENDPOINT sets it
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(live.url + "/dashboard")
        row = "#models tbody tr[data-model='slow']"
        page.wait_for_selector(row)
        page.fill("#pull-source", f"hf:{REPO}")
        page.click("#fits-button")
        quant = page.locator("#fits tbody tr[data-quant='Q4_1']")
        expect(quant).to_have_attribute("data-verdict", "gpu", timeout=60000)
        now = page.inner_text("#fits tbody tr[data-quant='Q4_1'] td:nth-child(3)")
        said = page.inner_text("#pull-status")
        page.click(f"{row} button[data-action='load']")
        state = page.locator(f"{row} td:nth-child(3)")
        expect(state).to_contain_text("loading · loading", timeout=10000)
        loading = state.inner_text()
        shot = tmp_path / "fits-and-load.png"
        page.locator("section:has(#models)").screenshot(path=str(shot))
        print(f"screenshot: {shot}")
        expect(state).to_have_text("ready", timeout=60000)
        browser.close()
    assert now.startswith("fits on the GPU, ") and "tokens a request" in now
    assert said == f"{REPO}: * is what Pull fetches"
    assert loading.startswith("loading · loading") and loading.endswith(" s")
    assert (tmp_path / "fits-and-load.png").stat().st_size > 1000
    assert set(hub.sent) == {f"{REPO}/{SMOL}"}  # its header, for the answer
    assert not (tmp_path / "m").exists() or not any(Path(tmp_path / "m").iterdir())
