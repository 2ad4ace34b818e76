"""POST /v1/images/generations through the official `openai` client, on tiny random SD 1.5-
and SDXL-shaped pipelines built here (diffusers' save_pretrained), served on the CPU: n
images of the asked size and format, the same pixels as the pipeline called directly for
the same seed, bad input refused before anything is queued, and the learned price of the
bucket in /status."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
from openai import OpenAI
from PIL import Image

from app.config.settings import ModelSpec
from tests.support.live import Live, live_server, make_settings, wait_until

MODELS = ("sd15", "sdxl")


@pytest.fixture(scope="module")
def live(tmp_path_factory, folders) -> Iterator[Live]:
    specs = tuple(
        ModelSpec(name=name, kind="diffusion", path=folder, max_batch=4, load="startup")
        for name, folder in folders.items()
    )
    settings = make_settings(
        tmp_path_factory.mktemp("server"),
        device="cpu",
        models=specs,
        health_interval=3600,
        max_image_pixels=512 * 512,
    )
    with live_server(settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(live) -> OpenAI:
    return OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def pixels(b64: str | None) -> np.ndarray:
    assert b64 is not None
    with Image.open(io.BytesIO(base64.b64decode(b64))) as image:
        assert image.format == "PNG"
        return np.array(image.convert("RGB"))


def direct(folder: Path, seed: int, **arguments) -> np.ndarray:
    """The pipeline called directly, as its users call it, with a seeded CPU generator."""
    from diffusers import AutoPipelineForText2Image, EulerAncestralDiscreteScheduler

    pipeline = AutoPipelineForText2Image.from_pretrained(folder, local_files_only=True)
    pipeline.scheduler = EulerAncestralDiscreteScheduler.from_config(pipeline.scheduler.config)
    pipeline.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(seed)
    return np.array(pipeline(generator=generator, **arguments).images[0])


@pytest.mark.parametrize("model", MODELS)
def test_the_openai_client_gets_n_pngs_of_the_asked_size(client, model):
    raw = client.images.with_raw_response.generate(
        model=model,
        prompt="a lighthouse at dusk",
        n=2,
        size="96x64",  # type: ignore[arg-type]  # any WxH on the 8-pixel grid
        response_format="b64_json",
        extra_body={"seed": 1, "steps": 2},
    )
    answer = raw.parse()
    images = [pixels(item.b64_json) for item in answer.data or []]
    assert [image.shape for image in images] == [(64, 96, 3)] * 2
    assert not np.array_equal(images[0], images[1])  # row 1 takes seed 2
    assert raw.headers["X-Vramgate-Bucket"] == "px96x64xb2"
    assert int(raw.headers["X-Vramgate-Batch"]) == 1  # one request (its 2 rows in one forward)
    assert [item.model_extra["seed"] for item in answer.data or []] == [1, 2]  # type: ignore[index]


def test_openais_image_model_names_reach_the_default_diffusion_model(client):
    """Open WebUI's OpenAI image engine sends `dall-e-2` when its model field is empty:
    OpenAI's image model names reach the first diffusion model configured (sd15)."""
    common = {"prompt": "a lighthouse", "size": "64x64", "response_format": "b64_json",
              "extra_body": {"seed": 3, "steps": 2}}  # fmt: skip
    own = pixels(client.images.generate(model="sd15", **common).data[0].b64_json)
    for name in ("dall-e-2", "dall-e-3", "gpt-image-1"):
        drawn = pixels(client.images.generate(model=name, **common).data[0].b64_json)
        assert np.array_equal(drawn, own), name
    listed = {m.id: m.aliases for m in client.models.list()}  # type: ignore[attr-defined]
    assert listed == {"sd15": ["dall-e-*", "gpt-image-*"], "sdxl": []}
    with pytest.raises(openai.NotFoundError):
        client.images.generate(model="midjourney", **common)


@pytest.mark.parametrize("model", MODELS)
def test_a_seed_gives_the_pixels_of_the_pipeline_called_directly(client, folders, model):
    def ours(seed: int) -> np.ndarray:
        answer = client.images.generate(
            model=model,
            prompt="a red fox in snow",
            size="64x64",  # type: ignore[arg-type]
            extra_body={
                "seed": seed,
                "steps": 3,
                "guidance_scale": 6.0,
                "negative_prompt": "blurry",
                "scheduler": "euler_a",
            },
        )
        return pixels((answer.data or [])[0].b64_json)

    theirs = direct(
        folders[model],
        11,
        prompt="a red fox in snow",
        negative_prompt="blurry",
        num_inference_steps=3,
        guidance_scale=6.0,
        width=64,
        height=64,
    )
    assert np.array_equal(ours(11), theirs)
    assert not np.array_equal(ours(12), theirs)


def test_auto_size_is_the_models_default_and_other_formats_are_encoded(client):
    answer = client.images.generate(
        model="sd15",
        prompt="a bowl of fruit",
        size="auto",
        output_format="webp",
        extra_body={"seed": 0, "steps": 1},
    )
    assert answer.size == "64x64"  # type: ignore[comparison-overlap]  # the tiny model's own
    data = base64.b64decode((answer.data or [])[0].b64_json or "")
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "WEBP" and image.size == (64, 64)


BAD = [
    ({"size": "60x64"}, "size", "invalid_size"),  # off the 8-pixel grid
    ({"size": "32x32"}, "size", "invalid_size"),  # below 64 a side
    ({"size": "1024x1024"}, "size", "invalid_size"),  # beyond max_image_pixels (512²)
    ({"size": "big"}, "size", "invalid_size"),
    ({"n": 11}, "n", "invalid_request"),  # beyond OpenAI's 10
    ({"n": 5}, "n", "invalid_request"),  # beyond the model's max_batch (4)
    ({"prompt": ""}, "prompt", "invalid_request"),
    ({"prompt": "   "}, "prompt", "invalid_request"),
    ({"response_format": "link"}, "response_format", "invalid_request"),
    ({"partial_images": 4, "stream": True}, "partial_images", "invalid_request"),
    ({"background": "transparent"}, "background", "invalid_request"),
    ({"scheduler": "warp"}, "scheduler", "invalid_request"),
    ({"steps": 0}, "steps", "invalid_request"),
    ({"model": "nobody"}, "model", "model_not_found"),
]


@pytest.mark.parametrize(("change", "param", "code"), BAD)
def test_bad_input_gets_a_clear_error_and_nothing_is_queued(live, change, param, code):
    body = {"model": "sd15", "prompt": "a cat", "size": "64x64"} | change
    answer = httpx.post(live.url + "/v1/images/generations", json=body, timeout=60)
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    assert answer.status_code == (404 if code == "model_not_found" else 400)
    status = live.status()
    assert status["queue"]["depth"] == 0 and status["pool"]["admitted_bytes"] == 0


def test_the_official_client_raises_bad_request_for_a_size_off_the_grid(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.images.generate(model="sdxl", prompt="a cat", size="100x100")  # type: ignore[arg-type]
    assert raised.value.code == "invalid_size"


def test_status_shows_the_model_and_the_learned_price_of_its_bucket(client, live):
    client.images.generate(
        model="sdxl",
        prompt="a mountain lake",
        size="128x64",  # type: ignore[arg-type]
        extra_body={"seed": 5, "steps": 1},
    )
    row = next(m for m in live.status()["models"] if m["name"] == "sdxl")
    assert row["kind"] == "diffusion" and row["pipeline"] == "StableDiffusionXLPipeline"
    assert row["default_size"] == "64x64" and row["running"] == []
    prices = {p["bucket"]: p for p in row["prices"]}
    assert prices["px128x64xb1"]["source"] == "learned", prices


LONG_STEPS = 150


def running_step(live: Live) -> int | None:
    """The step the long run (512², sd15) has reached (None: it does not run)."""
    row = next(m for m in live.status()["models"] if m["name"] == "sd15")
    long = [batch for batch in row["running"] if batch["bucket"] == "px512x512xb1"]
    if not long:
        return None
    ((step, steps),) = long[0]["steps"]
    assert steps in (0, LONG_STEPS + 1)  # not started yet, or PNDM's timesteps (steps + 1)
    return int(step)


def post_raw(live: Live, body: dict) -> socket.socket:
    """A request sent on a socket of our own, which the test closes to leave."""
    host, port = live.url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/images/generations HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    connection = socket.create_connection((host, int(port)))
    connection.sendall(head.encode() + data)
    return connection


def test_a_client_that_leaves_stops_its_run_and_waiting_same_shape_requests_batch(live):
    """One long run (512², 150 steps) holds the one slot; three requests queue behind it,
    two of one shape with another between them. The long run's client leaves: its run
    stops within a few steps of it (/status shows no step beyond), and the two of one
    shape then run as one batch."""
    long = {"model": "sd15", "prompt": "a long road", "size": "512x512", "steps": LONG_STEPS}
    connection = post_raw(live, long | {"seed": 0})
    wait_until(lambda: (running_step(live) or 0) >= 1, 60, "the long run's first step")
    answers: dict[str, httpx.Response] = {}

    def send(name: str, size: str, seed: int) -> None:
        body = {"model": "sd15", "prompt": name, "size": size, "steps": 2, "seed": seed}
        answers[name] = httpx.post(live.url + "/v1/images/generations", json=body, timeout=120)

    threads = []
    for depth, (name, size, seed) in enumerate(
        [("one", "64x64", 1), ("other", "128x64", 2), ("two", "64x64", 3)], start=1
    ):
        threads.append(threading.Thread(target=send, args=(name, size, seed)))
        threads[-1].start()
        wait_until(lambda d=depth: live.status()["queue"]["depth"] >= d, 30, "queued")
    step = running_step(live)
    assert step is not None and LONG_STEPS - step >= LONG_STEPS // 2, step
    connection.close()
    last = step  # the furthest step /status shows from here on
    while (now := running_step(live)) is not None:
        last = max(last, now)
        time.sleep(0.01)
    assert last - step <= 10, (step, last)  # not the 150 it asked for
    for thread in threads:
        thread.join(timeout=120)
    assert all(answer.status_code == 200 for answer in answers.values()), answers
    batches = {name: int(a.headers["X-Vramgate-Batch"]) for name, a in answers.items()}
    assert batches == {"one": 2, "two": 2, "other": 1}
    assert answers["one"].headers["X-Vramgate-Bucket"] == "px64x64xb2"
    assert next(m for m in live.status()["models"] if m["name"] == "sd15")["running"] == []


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def picture(width: int = 64, height: int = 64) -> np.ndarray:
    """A smooth gradient (an init image that is not noise)."""
    xs = np.linspace(0, 255, width)[None, :, None]
    ys = np.linspace(0, 255, height)[:, None, None]
    rgb = np.concatenate([xs + 0 * ys, ys + 0 * xs, (xs + ys) / 2], axis=2)
    return rgb.round().astype(np.uint8)


def direct_edit(
    folder: Path,
    seed: int,
    mask: np.ndarray | None = None,
    scheduler_class: str | None = None,
    **arguments,
) -> np.ndarray:
    """diffusers' image-to-image (or, with a mask, inpainting) pipeline called directly,
    with its own scheduler or `scheduler_class` over its config."""
    import diffusers
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting

    auto = AutoPipelineForImage2Image if mask is None else AutoPipelineForInpainting
    pipeline = auto.from_pretrained(folder, local_files_only=True)
    if scheduler_class is not None:
        scheduler = getattr(diffusers, scheduler_class)
        pipeline.scheduler = scheduler.from_config(pipeline.scheduler.config)
    pipeline.set_progress_bar_config(disable=True)
    if mask is not None:
        arguments["mask_image"] = Image.fromarray(mask)
    generator = torch.Generator().manual_seed(seed)
    return np.array(pipeline(generator=generator, **arguments).images[0])


@pytest.mark.parametrize("model", MODELS)
def test_an_edit_through_the_openai_client_is_the_image_to_image_pipelines_own(
    client, folders, model
):
    init = picture()
    raw = client.images.with_raw_response.edit(
        model=model,
        image=("init.png", png(init), "image/png"),
        prompt="a lighthouse at dusk",
        extra_body={"seed": 3, "steps": 4, "strength": 0.5},
    )
    answer = raw.parse()
    (ours,) = [pixels(item.b64_json) for item in answer.data or []]
    assert answer.size == "64x64"  # type: ignore[comparison-overlap]  # auto: the image's
    assert raw.headers["X-Vramgate-Bucket"] == "px64x64xb1~image2image"
    theirs = direct_edit(
        folders[model], 3, prompt="a lighthouse at dusk", image=Image.fromarray(init),
        strength=0.5, num_inference_steps=4,
    )  # fmt: skip
    assert np.array_equal(ours, theirs)


def test_an_edit_with_a_transparent_mask_is_the_inpainting_pipelines_own(client, folders):
    init = picture()
    alpha = np.full((64, 64), 255, dtype=np.uint8)
    alpha[16:48, 16:48] = 0  # OpenAI's mask: the transparent part is repainted
    mask_png = png(np.dstack([np.zeros((64, 64, 3), np.uint8), alpha]))
    answer = client.images.edit(
        model="sd15",
        image=("init.png", png(init), "image/png"),
        mask=("mask.png", mask_png, "image/png"),
        prompt="a boat",
        extra_body={"seed": 9, "steps": 3},
    )
    ours = pixels((answer.data or [])[0].b64_json)
    theirs = direct_edit(
        folders["sd15"], 9, mask=np.where(alpha == 0, 255, 0).astype(np.uint8), prompt="a boat",
        image=Image.fromarray(init), num_inference_steps=3, width=64, height=64,
    )  # fmt: skip
    assert np.array_equal(ours, theirs)


def edit_form(live: Live, image: bytes, mask: bytes | None = None, **fields) -> httpx.Response:
    files = {"image": ("i.png", image, "image/png")}
    if mask is not None:
        files["mask"] = ("m.png", mask, "image/png")
    data = {"model": "sd15", "prompt": "a cat", "steps": "2"} | fields
    return httpx.post(live.url + "/v1/images/edits", data=data, files=files, timeout=60)


def bomb() -> bytes:
    """A PNG whose header claims far more pixels than Pillow's bomb limit (tiny on disk)."""
    buffer = io.BytesIO()
    Image.new("1", (20000, 20000)).save(buffer, format="PNG")
    return buffer.getvalue()


EDIT_BAD = [
    ({"image": b"not an image"}, "image", "invalid_image", 400),
    ({"image": png(picture(1024, 1024))}, "image", "image_too_large", 413),  # > 512² pixels
    ({"image": bomb()}, "image", "image_too_large", 413),
    ({"mask": png(np.zeros((32, 32), np.uint8))}, "mask", "invalid_image", 400),  # not its size
    ({"mask": b"junk"}, "mask", "invalid_image", 400),
    ({"strength": "0.01"}, "strength", "invalid_request", 400),  # no step left of 2
    ({"strength": "1.5"}, "strength", "invalid_request", 400),
    ({"size": "60x60"}, "size", "invalid_size", 400),
    ({"n": "5"}, "n", "invalid_request", 400),
    ({"prompt": " "}, "prompt", "invalid_request", 400),
]


@pytest.mark.parametrize(("change", "param", "code", "status"), EDIT_BAD)
def test_bad_edits_get_a_clear_error_and_nothing_is_queued(live, change, param, code, status):
    image = change.pop("image", png(picture()))
    mask = change.pop("mask", None)
    answer = edit_form(live, image, mask, **change)
    error = answer.json()["error"]
    assert (error["param"], error["code"], answer.status_code) == (param, code, status), error
    state = live.status()
    assert state["queue"]["depth"] == 0 and state["pool"]["admitted_bytes"] == 0


def test_a_url_answer_serves_the_same_image_for_a_while(client, live):
    ask = {"model": "sd15", "prompt": "a kite", "size": "64x64"}
    extra = {"seed": 21, "steps": 2}
    linked = client.images.generate(**ask, response_format="url", extra_body=extra)  # type: ignore[arg-type]
    inline = client.images.generate(**ask, response_format="b64_json", extra_body=extra)  # type: ignore[arg-type]
    url = (linked.data or [])[0].url
    assert url is not None and url.startswith(live.url + "/v1/images/files/")
    fetched = httpx.get(url, timeout=30)
    assert fetched.headers["content-type"] == "image/png"
    assert np.array_equal(
        pixels(base64.b64encode(fetched.content).decode()), pixels((inline.data or [])[0].b64_json)
    )
    gone = httpx.get(live.url + "/v1/images/files/notkeptanymore", timeout=30)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "image_expired"


def test_a_stream_sends_partial_previews_then_the_image_of_the_same_seed(client):
    ask = {"model": "sd15", "prompt": "a windmill", "size": "64x96"}
    extra = {"seed": 8, "steps": 6}
    events = list(client.images.generate(**ask, stream=True, partial_images=2, extra_body=extra))  # type: ignore[call-overload]
    assert [e.type for e in events] == ["image_generation.partial_image"] * 2 + [
        "image_generation.completed"
    ]
    assert [e.partial_image_index for e in events[:2]] == [0, 1]
    first, second = (pixels(e.b64_json) for e in events[:2])
    assert first.shape == second.shape == (96, 64, 3)  # the preview scaled to the image
    assert not np.array_equal(first, second)  # two steps of the run
    done = events[-1]
    assert (done.size, done.output_format, done.background) == ("64x96", "png", "opaque")
    plain = client.images.generate(**ask, extra_body=extra)  # type: ignore[arg-type]
    assert np.array_equal(pixels(done.b64_json), pixels((plain.data or [])[0].b64_json))


@pytest.mark.parametrize(
    ("change", "param", "code", "status"),
    [
        ({"n": 5}, "n", "invalid_request", 400),
        ({"model": "nobody"}, "model", "model_not_found", 404),
    ],
)
def test_a_stream_that_cannot_run_is_refused_before_its_events(live, change, param, code, status):
    body = {"model": "sd15", "prompt": "a cat", "size": "64x64", "stream": True} | change
    answer = httpx.post(live.url + "/v1/images/generations", json=body, timeout=60)
    assert answer.headers["content-type"].startswith("application/json")
    error = answer.json()["error"]
    assert (error["param"], error["code"], answer.status_code) == (param, code, status)


def test_a_stream_whose_client_leaves_stops_its_run(live):
    body = {"model": "sd15", "prompt": "a long road", "size": "512x512", "steps": LONG_STEPS}
    connection = post_raw(live, body | {"seed": 0, "stream": True, "partial_images": 3})
    wait_until(lambda: (running_step(live) or 0) >= 1, 60, "the long run's first step")
    head = connection.recv(4096)
    assert b"200 OK" in head and b"text/event-stream" in head
    step = running_step(live) or 0
    connection.close()
    last = step
    while (now := running_step(live)) is not None:
        last = max(last, now)
        time.sleep(0.01)
    assert last - step <= 10, (step, last)
    assert live.status()["queue"]["depth"] == 0


def test_a_streamed_edit_sends_image_edit_events(client):
    events = list(
        client.images.edit(
            model="sd15",
            image=("init.png", png(picture()), "image/png"),
            prompt="a red boat",
            stream=True,
            partial_images=1,
            output_format="webp",
            extra_body={"seed": 5, "steps": 4, "strength": 1.0},
        )
    )
    assert [e.type for e in events] == ["image_edit.partial_image", "image_edit.completed"]
    data = base64.b64decode(events[-1].b64_json)
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "WEBP" and image.size == (64, 64)


def test_the_running_batch_s_preview_is_served_while_it_runs(live):
    idle = httpx.get(live.url + "/v1/images/preview/sd15", timeout=30)
    assert idle.status_code == 204
    body = {"model": "sd15", "prompt": "a long road", "size": "512x512", "steps": LONG_STEPS}
    connection = post_raw(live, body | {"seed": 0})
    try:
        wait_until(
            lambda: httpx.get(live.url + "/v1/images/preview/sd15", timeout=30).status_code == 200,
            60,
            "a preview",
        )
        shown = httpx.get(live.url + "/v1/images/preview/sd15", timeout=30)
        with Image.open(io.BytesIO(shown.content)) as image:
            assert (image.format, image.size) == ("PNG", (64, 64))  # the latents' size
    finally:
        connection.close()
    wait_until(lambda: running_step(live) is None, 60, "the run's end")
    assert httpx.get(live.url + "/v1/images/preview/sd15", timeout=30).status_code == 204


def test_a_prompt_past_the_text_encoders_window_is_cut_and_the_answer_says_so(client, folders):
    # the tiny CLIP tokenizer reads one token a character: 75 of them fit its 77 positions
    prompt = "a" * 70 + " lighthouse on a cliff"  # the window ends inside "lighthouse"
    answer = client.images.generate(
        model="sd15", prompt=prompt, size="64x64",  # type: ignore[arg-type]
        extra_body={"seed": 4, "steps": 2, "negative_prompt": "blurry", "scheduler": "euler_a"},
    )  # fmt: skip
    extra = answer.model_extra or {}
    (warning,) = extra["warnings"]
    assert warning.startswith("prompt is longer than model 'sd15'") and "cliff" in warning
    assert "aaaa" not in warning.split("cut:")[1]  # only the end that was cut
    theirs = direct(folders["sd15"], 4, prompt=prompt, negative_prompt="blurry",
                    num_inference_steps=2, width=64, height=64)  # fmt: skip
    assert np.array_equal(pixels((answer.data or [])[0].b64_json), theirs)  # diffusers' cut
    short = client.images.generate(
        model="sd15", prompt="a lighthouse", size="64x64",  # type: ignore[arg-type]
        extra_body={"steps": 1},
    )  # fmt: skip
    assert "warnings" not in (short.model_extra or {})
