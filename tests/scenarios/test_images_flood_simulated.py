"""Image generation on a simulated device (the simulated text-to-image model, an ordinary
config choice: app.engines.simulated.images): a flood of mixed sizes whose true costs the
server does not know learns a price per size with no out-of-memory and the reserve left
to other programs; a request that fits only with its VAE decoded in tiles is admitted
tiled, both when the full decode can never fit the device and when it cannot fit now.

The memory assertions can fail: the simulated device raises past its capacity only, so
the test reads what the server admitted (its gate) against capacity less the reserve,
and the device's own high water, which holds the model's true bytes (1.5 times what it
declares): a gate that priced by the declared bytes would put two 1024² images beside
each other in a pool that holds one."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from typing import Any

import httpx
import pytest

from app.config.settings import ModelSpec, SimulatedImages
from app.models.image_buckets import ImageBucket
from tests.scenarios.test_flood_simulated import admitted_high_water
from tests.support.live import wait_until

MiB = 2**20
SIZES = {512: 0.5, 768: 0.3, 1024: 0.2}  # side: share of the flood
DECLARED, TRUE = 2000, 3000  # bytes a pixel: what the model says, what it holds


def images_model(**images: Any) -> ModelSpec:
    return ModelSpec(name="paint", kind="simulated", max_batch=4, images=SimulatedImages(**images))


async def flood(url: str, sides: list[int], clients: int) -> list[httpx.Response]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for side in sides:
        queue.put_nowait(side)
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def one_client() -> None:
            while not queue.empty():
                side = queue.get_nowait()
                body = {"model": "paint", "prompt": f"a cat {side}", "size": f"{side}x{side}"}
                answers.append(await client.post("/v1/images/generations", json=body))

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return answers


@pytest.mark.slow
def test_simulated_image_flood_learns_a_price_per_size_with_no_oom(server_factory):
    capacity, reserve = 8 * 2**30, 512 * MiB
    live = server_factory(
        device="simulated:8GiB",
        reserve=reserve,
        models=(images_model(bytes_per_pixel=DECLARED, true_bytes_per_pixel=TRUE, step_ms=20),),
        max_image_pixels=2048 * 2048,
    )
    device = live.service.device
    admitted = admitted_high_water(live.service.scheduler.gate)
    rng = random.Random(20261201)
    sides = rng.choices(list(SIZES), weights=list(SIZES.values()), k=80)

    answers = asyncio.run(flood(live.url, sides, clients=12))

    assert len(answers) == len(sides)  # none lost
    assert all(a.status_code == 200 for a in answers), Counter(a.status_code for a in answers)
    assert device.oom_count == 0 and live.status()["counters"]["ooms"] == 0
    assert admitted[0] <= capacity - reserve, admitted[0] / MiB
    assert device.high_water <= capacity - reserve, device.high_water / MiB
    for answer in answers:  # each image of its asked size, and its cost said
        size = answer.json()["size"]
        assert answer.headers["x-vramgate-bucket"].startswith(f"px{size}xb")
        source = answer.headers["x-vramgate-price-source"].removesuffix("+tiled")
        assert source in {"unseen", "learned", "neighbour", "extrapolated"}
    batches = Counter(a.headers["x-vramgate-batch"] for a in answers)
    tiled = sum(a.headers["x-vramgate-bucket"].endswith("~tiled") for a in answers)
    prices = {p["bucket"]: p for p in live.status()["models"][0]["prices"]}
    # A size's price is learned from its runs that ran alone (a first sight of a size
    # runs alone unless a larger size is already measured: then it borrows that larger
    # measured price, which covers it, and runs beside others). Every size is priced
    # from a measurement and at least its truth; the measured ones within 1.2 of it.
    measured = {}  # bucket: (size, price) of every bucket measured alone
    for bucket, price in prices.items():
        parsed = ImageBucket.parse(bucket)
        if parsed is not None and not parsed.tiled and price["source"] == "learned":
            measured[bucket] = (parsed, price["price_bytes"])
    for parsed, price in measured.values():
        true = TRUE * parsed.pixels
        # learned from what the runs held, not from the declared 2000 bytes a pixel
        assert true <= price < 1.2 * true, (parsed, price)
    priced = {}  # side: how a lone image of it is priced
    for side in SIZES:
        own = measured.get(f"px{side}x{side}xb1")
        if own is not None:
            priced[side] = f"learned {own[1] / MiB:.0f} MiB"
            continue
        larger = [price for parsed, price in measured.values() if parsed.pixels >= side * side]
        assert larger and min(larger) >= TRUE * side * side, (side, prices)
        priced[side] = f"a larger measured one's {min(larger) / MiB:.0f} MiB"
    assert len(measured) >= 2, prices  # the flood taught more than the warm-up's size
    print(
        f"\nimage flood: {len(answers)} requests (512², 768², 1024²) from 12 clients, "
        f"batches {dict(batches)}, {tiled} decoded in tiles; measured "
        + ", ".join(f"{b} {price / MiB:.0f} MiB" for b, (_, price) in measured.items())
        + "; a lone image priced "
        + ", ".join(f"{s}²: {how}" for s, how in priced.items())
        + f" (true {TRUE} B/px, declared {DECLARED}); admitted at most "
        f"{admitted[0] / MiB:.0f} MiB of {(capacity - reserve) / MiB:.0f}; device high "
        f"water {device.high_water / MiB:.0f} MiB; OOMs 0"
    )


def generate(url: str, side: int, **extra: Any) -> httpx.Response:
    body = {"model": "paint", "prompt": "a lighthouse", "size": f"{side}x{side}", **extra}
    return httpx.post(url + "/v1/images/generations", json=body, timeout=60)


def test_simulated_image_that_never_fits_whole_is_decoded_in_tiles(server_factory):
    # 1024² holds 2000 B/px × 1 Mpx = 2 GiB whole: past a 1.5 GiB device, but a tiled
    # decode (512² tiles, the denoising a quarter of the image) holds a quarter of it
    live = server_factory(device="simulated:1.5GiB", models=(images_model(),))
    answer = generate(live.url, 1024)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-vramgate-bucket"] == "px1024x1024xb1~tiled"
    assert answer.headers["x-vramgate-price-source"] == "unseen+tiled"
    assert answer.json()["size"] == "1024x1024"
    assert generate(live.url, 512).headers["x-vramgate-bucket"] == "px512x512xb1"  # fits


def test_simulated_image_that_cannot_fit_now_is_admitted_tiled_at_once(server_factory):
    live = server_factory(device="simulated:3GiB", models=(images_model(step_ms=50),))
    # teach the prices: 1024² whole (2 GiB), 768² whole; 1536² never fits whole (4.5
    # GiB), so it runs tiled and teaches the tiled variant its first price
    assert generate(live.url, 1024).headers["x-vramgate-bucket"] == "px1024x1024xb1"
    assert generate(live.url, 768).status_code == 200
    tiled = generate(live.url, 1536)
    assert tiled.headers["x-vramgate-bucket"] == "px1536x1536xb1~tiled"

    # a long 768² run (150 steps, ~4 s) holds ~1.1 GiB: a whole 1024² (2 GiB) cannot
    # start beside it in 3 GiB, its tiled decode (priced by its tiled neighbour) can
    long: list[httpx.Response] = []
    runner = threading.Thread(target=lambda: long.append(generate(live.url, 768, steps=150)))
    runner.start()
    wait_until(lambda: live.status()["queue"]["running"] == 1)
    answer = generate(live.url, 1024)
    still_running = live.status()["queue"]["running"]
    runner.join()
    assert answer.status_code == 200 and long[0].status_code == 200
    assert answer.headers["x-vramgate-bucket"] == "px1024x1024xb1~tiled"
    assert answer.headers["x-vramgate-price-source"] == "neighbour+tiled"
    assert still_running == 1  # it ran beside the long one, not after it
    # the whole decode is still the choice once there is room
    assert generate(live.url, 1024).headers["x-vramgate-bucket"] == "px1024x1024xb1"


def test_simulated_images_are_never_batched_past_the_device(server_factory):
    # four 1024² together would be priced 8 GiB (2000 B/px): past a 6 GiB device. They
    # gather in the queue behind a first 1024² (unseen: it runs alone), then run in
    # batches of two (4 GiB) at most, never as one 8 GiB guess clamped to the device
    live = server_factory(device="simulated:6GiB", models=(images_model(step_ms=50),))
    first: list[httpx.Response] = []
    runner = threading.Thread(target=lambda: first.append(generate(live.url, 1024, steps=60)))
    runner.start()
    wait_until(lambda: live.status()["queue"]["running"] == 1)
    answers = asyncio.run(flood(live.url, [1024] * 4, clients=4))
    runner.join()
    assert [a.status_code for a in [*first, *answers]] == [200] * 5
    assert live.service.device.oom_count == 0
    buckets = Counter(a.headers["x-vramgate-bucket"] for a in answers)
    assert set(buckets) <= {"px1024x1024xb1", "px1024x1024xb2"}, buckets
    assert buckets["px1024x1024xb2"] >= 2, buckets  # they did batch, within the device


def test_simulated_image_measured_near_the_top_still_runs_whole(server_factory):
    # 1024² holds 2900 B/px × 1 Mpx = 2.83 GiB of a 3 GiB device, measured once (its
    # warm-up at the default size): priced 10% above that, past the device. It did run
    # whole in that much, so it runs whole (alone), not tiled as though it never fits
    live = server_factory(
        device="simulated:3GiB", models=(images_model(bytes_per_pixel=2900, default_size=1024),)
    )
    prices = {p["bucket"]: p["price_bytes"] for p in live.status()["models"][0]["prices"]}
    assert prices["px1024x1024xb1"] > 3 * 2**30  # the premise: priced past the device
    answer = generate(live.url, 1024)
    assert answer.status_code == 200, answer.text
    assert int(answer.headers["x-vramgate-price-bytes"]) == 3 * 2**30  # so it ran alone
    assert answer.headers["x-vramgate-bucket"] == "px1024x1024xb1"
    assert answer.headers["x-vramgate-price-source"] == "learned"
    assert live.service.device.oom_count == 0
    tiled = generate(live.url, 1536)  # the twin that never fits whole: tiled
    assert tiled.headers["x-vramgate-bucket"] == "px1536x1536xb1~tiled"
