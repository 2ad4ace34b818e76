"""The dashboard in headless Chromium against a live server: live charts, offline."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from app.config.settings import ConfigSource, FaultInjection, ModelSpec, SimulatedBucket
from tests.support.live import live_server, make_settings, wait_until
from tests.support.random_models import save_model_wheel, save_random_bert

MiB = 2**20
DOCS = Path(__file__).resolve().parents[2] / "docs"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run)")


def painted_pixels(page, canvas_id: str) -> int:
    return page.evaluate(
        """id => { const c = document.getElementById(id);
                   const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                   let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
                   return n; }""",
        canvas_id,
    )


def drive_traffic(live, seconds: float) -> None:
    """Four clients of mixed sizes while another program's memory use comes and goes."""
    device = live.service.device
    stop = time.monotonic() + seconds

    def client(words: int) -> None:
        with httpx.Client(base_url=live.url, timeout=60) as http:
            while time.monotonic() < stop:
                http.post("/v1/embeddings", json={"model": "sim", "input": "w " * words})

    threads = [threading.Thread(target=client, args=(w,)) for w in (1, 1, 40, 40)]
    for thread in threads:
        thread.start()
    while time.monotonic() < stop:
        phase = int(time.monotonic() * 2 / max(seconds, 1) * 3) % 3
        device.set_external((0, 400, 900)[phase] * MiB)
        time.sleep(0.2)
    for thread in threads:
        thread.join()


def test_dashboard_draws_live_data_and_talks_only_to_its_server(server_factory, request):
    from playwright.sync_api import sync_playwright

    model = ModelSpec(
        name="sim",
        kind="simulated",
        inject=FaultInjection(oom_on_calls=(6,)),
        buckets=(
            SimulatedBucket(size=16, bytes=300 * MiB, run_ms=300),
            SimulatedBucket(size=64, bytes=700 * MiB, run_ms=600),
        ),
    )
    live = server_factory(device="simulated:2GiB", models=(model,))
    seconds = 25 if request.config.getoption("--update-docs") else 4
    traffic = threading.Thread(target=drive_traffic, args=(live, seconds), daemon=True)
    traffic.start()
    wait_until(lambda: len(live.service.history.samples) >= 3, 10, "history")

    requested: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("request", lambda r: requested.append(r.url))
        page.goto(live.url + "/dashboard")
        traffic.join()
        page.wait_for_function("document.body.dataset.updated !== undefined", timeout=15000)
        page.wait_for_function(
            "document.querySelectorAll('#prices tbody tr').length >= 2", timeout=15000
        )
        buckets = page.locator("#prices tbody tr td:nth-child(2)").all_inner_texts()
        codes = page.locator("#rejections tbody tr td:nth-child(3)").all_inner_texts()
        memory_pixels = painted_pixels(page, "memory")
        state = page.inner_text("#state")
        shot = Path(request.config.rootpath) / "docs" / "dashboard.png"
        target = shot if request.config.getoption("--update-docs") else None
        page.screenshot(
            path=str(target or Path(live.service.settings.resolved_log_dir) / "dashboard.png"),
            full_page=True,
        )
        browser.close()

    assert set(buckets) == {"w16", "w64"}
    assert "out_of_memory" in codes
    assert memory_pixels > 5000
    assert state == "ready"
    assert requested and all(url.startswith(live.url + "/") for url in requested), requested


def test_dashboard_signs_in_with_the_token_in_its_address(server_factory):
    """With a token set, the address the tray opens signs Chromium in; the page's own
    reads and its model buttons then carry the session (cookie and page key), and the
    token and the key leave the address bar."""
    from playwright.sync_api import expect, sync_playwright

    secret = "dashboard-token-value"
    model = ModelSpec(
        name="sim", kind="simulated", buckets=(SimulatedBucket(size=16, bytes=MiB, run_ms=1),)
    )
    live = server_factory(device="simulated:1GiB", models=(model,), token=secret)
    statuses: list[int] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page()
        page.on("response", lambda r: statuses.append(r.status))
        assert page.goto(live.url + "/dashboard").status == 401  # no token, no page
        page.goto(f"{live.url}/dashboard?token={secret}")
        page.wait_for_function("document.body.dataset.updated !== undefined", timeout=15000)
        state, address = page.inner_text("#state"), page.url
        row = "#models tbody tr[data-model='sim']"
        page.click(f"{row} button[data-action='unload']")
        expect(page.locator(f"{row} td:nth-child(3)")).to_have_text("unloaded", timeout=15000)
        page.reload()  # a reload keeps the session: the key stays in the page's storage
        page.wait_for_function("document.body.dataset.updated !== undefined", timeout=15000)
        error = page.inner_text("#error")
        browser.close()

    assert state == "ready" and error == ""
    assert address == live.url + "/dashboard"
    assert statuses[:3] == [401, 303, 200] and 401 not in statuses[3:]
    assert live.service.registry.entries["sim"].state == "unloaded"


def test_dashboard_models_view_pulls_with_progress_and_loads_and_unloads(tmp_path, request):
    """The Models view in headless Chromium: a local wheel pulled from the page (its
    progress bar fed by the server's stream), then the new model loaded and unloaded
    with its buttons; each step seen in /status."""
    from playwright.sync_api import expect, sync_playwright

    model = save_random_bert(tmp_path / "src/tiny-embed", hidden=32, layers=1, heads=2, max_seq=64)
    wheel = save_model_wheel(model, tmp_path / "tiny_embed-1.0-py3-none-any.whl")
    config = tmp_path / "config.toml"
    config.write_text('[[models]]\nname = "sim"\nkind = "simulated"\nweights = "200MiB"\n')
    source = ConfigSource(config, {"device": "cpu", "models_dir": tmp_path / "models"})
    models = source.settings().models
    settings = make_settings(tmp_path, device="cpu", models=models, keep_alive="5m")
    with live_server(settings, models_source=source) as live, sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(live.url + "/dashboard")
        page.wait_for_selector("#models tbody tr[data-model='sim']")
        page.fill("#pull-source", str(wheel))
        page.click("#pull-button")
        expect(page.locator("#pull-status")).to_have_text("pulled tiny-embed", timeout=60000)
        said = page.inner_text("#pull-status")
        bar = page.locator("#pull-bar")
        bar_max, bar_value = bar.get_attribute("max"), bar.get_attribute("value")
        row = "#models tbody tr[data-model='tiny-embed']"
        page.wait_for_selector(row, timeout=10000)
        unloaded = page.inner_text(f"{row} td:nth-child(3)")
        page.click(f"{row} button[data-action='load']")
        expect(page.locator(f"{row} td:nth-child(3)")).to_have_text("ready", timeout=60000)
        loaded = live.status()["models"][1]
        memory = page.inner_text(f"{row} td:nth-child(4)")
        keep_alive_left = page.inner_text(f"{row} td:nth-child(5)")
        page_source = page.input_value("#pull-source")
        shot = Path(request.config.rootpath) / "docs" / "models.png"
        target = shot if request.config.getoption("--update-docs") else tmp_path / "models.png"
        page.locator("section:has(#models)").screenshot(path=str(target))
        page.click(f"{row} button[data-action='unload']")
        expect(page.locator(f"{row} td:nth-child(3)")).to_have_text("unloaded", timeout=60000)
        browser.close()
        final = live.status()["models"][1]

    assert said == "pulled tiny-embed"
    assert bar_max is not None and bar_max == bar_value  # bytes: followed the copy to its end
    assert float(bar_max) > 1000
    assert unloaded == "unloaded" and keep_alive_left == "5 min"
    assert page_source == ""  # the field is cleared for the next pull
    assert loaded["name"] == "tiny-embed" and loaded["state"] == "ready"
    assert loaded["weights_bytes"] > 0 and memory.endswith("MiB")
    assert final["state"] == "unloaded" and final["weights_bytes"] == 0


def test_dashboard_devices_view_shows_each_simulated_gpu_and_its_models(server_factory, request):
    """Two simulated GPUs (`simulated:2GiB,1GiB`): the Devices table has a row per device
    with its own memory, queue, models and served count, as /status gives them."""
    from playwright.sync_api import sync_playwright

    bucket = SimulatedBucket(size=16, bytes=100 * MiB, run_ms=2)
    both = ModelSpec(name="both", kind="simulated", replicas=2, load="startup", buckets=(bucket,))
    big = ModelSpec(
        name="big", kind="simulated", weights=1200 * MiB, load="startup", buckets=(bucket,)
    )
    live = server_factory(device="simulated:1GiB,2GiB", models=(both, big))
    with httpx.Client(base_url=live.url, timeout=60) as http:
        for _ in range(20):
            assert http.post("/v1/embeddings", json={"model": "both", "input": "w"}).is_success
    expected = {d["id"]: d for d in live.status()["devices"]}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(live.url + "/dashboard")
        page.wait_for_function(
            "document.querySelectorAll('#devices tbody tr').length == 2", timeout=15000
        )
        rows = [
            page.locator(f"#devices tbody tr:nth-child({i}) td").all_inner_texts() for i in (1, 2)
        ]
        models = page.locator("#models tbody tr td:first-child").all_inner_texts()
        target = DOCS / "devices.png" if request.config.getoption("--update-docs") else None
        path = target or Path(live.service.settings.resolved_log_dir) / "devices.png"
        page.locator("#devices-section").screenshot(path=str(path))
        browser.close()

    assert [r[0] for r in rows] == ["simulated:0", "simulated:1"]
    assert rows[0][1] == "Simulated 1.0 GiB" and rows[1][1] == "Simulated 2.0 GiB"
    assert rows[0][9] == "both" and rows[1][9] == "both, big"  # big fits only on the 2 GiB
    served = {row[0]: int(row[10]) for row in rows}
    assert served == {key: expected[key]["served"] for key in served}
    assert sum(served.values()) >= 20
    assert "both (simulated:0, simulated:1)" in models and "big (simulated:1)" in models


def test_dashboard_shows_speech_and_vision_language_models_and_what_runs(tmp_path):
    """A Whisper and a LLaVA beside the others: their kinds in the Models view (the
    vision-language chat model says it sees), and in Prices what a bucket runs: audio
    windows per generate call, a prompt with images."""
    from openai import OpenAI
    from playwright.sync_api import sync_playwright

    from tests.api.test_chat_images import openai_chat, png
    from tests.support.random_models import save_random_llava
    from tests.support.random_whisper import save_random_whisper, tone, write_wav

    models = (
        ModelSpec(name="whisper", kind="speech", path=save_random_whisper(tmp_path / "w")),
        ModelSpec(name="vl", kind="generation", path=save_random_llava(tmp_path / "vl")),
    )
    settings = make_settings(tmp_path, device="cpu", models=models, cpu_threads=1)
    audio = write_wav(tmp_path / "clip.wav", tone(3.0, seed=4))
    with live_server(settings) as live, sync_playwright() as pw:
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        with audio.open("rb") as file:
            client.audio.transcriptions.create(model="whisper", file=file)
        client.chat.completions.create(model="vl", messages=openai_chat(png(1)), max_tokens=2)
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(live.url + "/dashboard")
        page.wait_for_selector("#models tbody tr[data-model='vl']")
        page.wait_for_function(
            "document.querySelectorAll('#prices tbody tr').length >= 2", timeout=15000
        )
        kinds = {
            name: page.inner_text(f"#models tbody tr[data-model='{name}'] td:nth-child(2)")
            for name in ("whisper", "vl")
        }
        buckets = page.locator("#prices tbody tr td:nth-child(2)").all_inner_texts()
        browser.close()

    assert kinds == {"whisper": "speech", "vl": "generation · vision"}
    assert "w30xb1 · 1 × 30 s audio a call" in buckets, buckets
    assert any(b.endswith("+images · prompt with images") for b in buckets), buckets
