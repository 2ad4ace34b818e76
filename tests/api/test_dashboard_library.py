"""The dashboard's Library in headless Chromium: a search of the loopback Hub (holding
SmolLM2's real GGUF, and a Q8_0 listed beside it) lists each quantisation with where it
fits on the simulated GPU, the verdicts change as another program takes the GPU's memory,
and a quantisation's Pull fills the progress bar (the Hub paused halfway), is cancelled
there and resumed by the next Pull; a screenshot in the test's folder."""

from __future__ import annotations

import shutil
import threading

import httpx
import pytest

from app.config.settings import ConfigSource
from tests.support.hub import Hub
from tests.support.live import live_server, make_settings, wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MiB = 2**20
REPO = "Org/Smol-GGUF"
SMOL = "SmolLM2-135M-Instruct-Q4_1.gguf"
LARGER = "SmolLM2-135M-Instruct-Q8_0.gguf"

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run)")


def test_search_verdicts_and_a_pull_with_its_progress_on_the_library(
    smollm2_gguf, tmp_path, monkeypatch
):
    from huggingface_hub import constants
    from playwright.sync_api import expect, sync_playwright

    config = tmp_path / "config.toml"
    config.write_text('[[models]]\nname = "sim"\nkind = "simulated"\nload = "demand"\n')
    source = ConfigSource(config, {"device": "simulated:512MiB", "models_dir": tmp_path / "m"})
    settings = make_settings(tmp_path, device="simulated:512MiB", models=source.settings().models)
    smol = smollm2_gguf.read_bytes()
    with Hub() as hub, live_server(settings, models_source=source) as live, sync_playwright() as pw:
        hub.add(REPO, {SMOL: smol, LARGER: b"\0" * (len(smol) * 3 // 2)})
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)  # as HF_ENDPOINT sets it
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1200, "height": 1400})
        page.goto(live.url + "/dashboard")
        page.fill("#library-query", "smol")
        page.click("#library-search")
        quant = page.locator("#library tbody tr[data-quant='Q4_1']")
        expect(quant).to_have_attribute("data-verdict", "gpu", timeout=60000)
        roomy = quant.locator("td:nth-child(4)").inner_text()
        live.service.device.set_external(400 * MiB)  # another program takes 400 MiB
        wait_until(lambda: live.status()["devices"][0]["used_by_others_bytes"] > 0, 30, "seen")
        page.click("#library-search")
        expect(quant).to_have_attribute("data-verdict", "split", timeout=60000)
        tight = quant.locator("td:nth-child(4)").inner_text()
        searched = dict(hub.sent)

        go_on = threading.Event()
        hub.paused[f"{REPO}/{SMOL}"] = (len(smol) // 2, go_on)  # the pull waits halfway
        quant.locator("button[data-action='pull']").click()
        status = page.locator("#pull-status")
        page.wait_for_function(  # the bar as far as the Hub has sent: about half
            "() => { const bar = document.getElementById('pull-bar');"
            " return bar.max > 1 && bar.value / bar.max > 0.4; }",
            timeout=60000,
        )
        bar = page.locator("#pull-bar")
        halfway = float(bar.get_attribute("value")) / float(bar.get_attribute("max"))
        said = status.inner_text()
        shot = tmp_path / "library.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
        page.click("#pull-cancel")  # it stops at its next chunk, once the Hub goes on
        go_on.set()
        expect(status).to_have_text(
            "the pull was cancelled; what came is kept, and pulling it again resumes it",
            timeout=60000,
        )
        expect(page.locator("#pull-cancel")).to_be_hidden()
        hub.ranges.clear()
        quant.locator("button[data-action='pull']").click()  # again: it resumes
        expect(status).to_contain_text("pulled ", timeout=60000)
        browser.close()
        idle = httpx.post(live.url + "/admin/models/pull/cancel", timeout=10)
    assert idle.status_code == 409 and idle.json()["error"]["message"] == "no pull is under way"
    resumed = [r for key, r in hub.ranges if key == f"{REPO}/{SMOL}"]
    assert len(resumed) == 1 and int(resumed[0].split("=")[1].rstrip("-")) >= len(smol) // 2
    assert roomy.startswith("fits on the GPU, ") and "layers on the CPU" in tight
    assert set(searched) == {f"{REPO}/{SMOL}"} and searched[f"{REPO}/{SMOL}"] <= 4 * MiB
    assert 0.4 < halfway <= 0.5  # where the Hub paused
    assert said.startswith(f"downloading {REPO}: ") and " MiB of 93.8 MiB · " in said
    assert said.endswith(" s left") and "MiB/s" in said
    assert shot.stat().st_size > 1000
