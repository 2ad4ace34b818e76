"""AUTOMATIC1111's API (`/sdapi/v1/*`) on a real server with tiny random SD 1.5- and
SDXL-shaped pipelines, served on the CPU: Open WebUI's own requests replayed in its
order, the same seed giving the diffusers pipeline's own pixels, img2img and inpainting,
progress with a latent preview, interrupt, and bad input refused before queueing while
the fields A1111's clients add are ignored."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from app.config.settings import ModelSpec
from tests.api.images.test_routes import direct, direct_edit, picture, png
from tests.support.live import Live, live_server, make_settings, wait_until


@pytest.fixture(scope="module")
def live(tmp_path_factory, folders) -> Iterator[Live]:
    specs = tuple(
        ModelSpec(name=name, kind="diffusion", path=folder, max_batch=4, load="startup")
        for name, folder in folders.items()
    )
    settings = make_settings(
        tmp_path_factory.mktemp("server"), device="cpu", models=specs, health_interval=3600
    )
    with live_server(settings) as server:
        yield server


@pytest.fixture
def http(live) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=300) as client:
        yield client


def decoded(b64: str) -> Image.Image:
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    image.load()
    return image


def test_open_webui_s_requests_in_its_order_get_what_it_reads(live):
    """Open WebUI (backend/open_webui/routers/images.py): the URL check (GET options),
    the model list (GET sd-models: title, model_name), choosing a model (GET options;
    POST them back with sd_model_checkpoint changed), the model in use (GET options),
    then txt2img with its payload and the admin's AUTOMATIC1111_PARAMS; it reads
    `images` (bare base64) and `info`. Every call carries its `authorization` header,
    empty when no A1111 credentials are set."""
    with httpx.Client(base_url=live.url, timeout=300, headers={"authorization": ""}) as http:
        assert http.get("/sdapi/v1/options").status_code == 200  # verify_url
        models = http.get("/sdapi/v1/sd-models").json()  # get_models
        listed = [{"id": m["title"], "name": m["model_name"]} for m in models]
        assert listed == [{"id": "sd15", "name": "sd15"}, {"id": "sdxl", "name": "sdxl"}]
        options = http.get("/sdapi/v1/options").json()  # set_image_model
        assert options["sd_model_checkpoint"] == "sd15"
        options["sd_model_checkpoint"] = "sdxl"
        http.post("/sdapi/v1/options", json=options).raise_for_status()
        assert http.get("/sdapi/v1/options").json()["sd_model_checkpoint"] == "sdxl"
        names = [s["name"] for s in http.get("/sdapi/v1/samplers").json()]
        assert {"Euler a", "DPM++ 2M Karras", "DDIM"} <= set(names)
        data = {"prompt": "a lighthouse", "batch_size": 2, "width": 64, "height": 96, "steps": 2,
                "negative_prompt": "blurry"}  # fmt: skip
        data |= {"cfg_scale": 5, "sampler_name": "DPM++ 2M", "scheduler": "Karras", "seed": 4}
        answer = http.post("/sdapi/v1/txt2img", json=data)
        res = answer.json()
        assert answer.status_code == 200, res
        images = [decoded(b64) for b64 in res["images"]]
        assert [(i.format, i.size) for i in images] == [("PNG", (64, 96))] * 2
        info = json.loads(res["info"])
        assert (info["sd_model_name"], info["all_seeds"]) == ("sdxl", [4, 5])
        assert info["sampler_name"] == "DPM++ 2M Karras"
        assert images[1].info["parameters"] == (
            "a lighthouse\nNegative prompt: blurry\nSteps: 2, Sampler: DPM++ 2M Karras, "
            "CFG scale: 5, Seed: 5, Size: 64x96, Model: sdxl"
        )
        assert res["parameters"]["batch_size"] == 2
        assert answer.headers["X-Vramgate-Bucket"] == "px64x96xb2"  # under the gate, as one batch
        http.post("/sdapi/v1/options", json={"sd_model_checkpoint": "sd15"}).raise_for_status()


def test_a_seed_gives_the_pixels_of_the_pipeline_called_directly(http, folders):
    body = {"prompt": "a red fox in snow", "negative_prompt": "blurry", "seed": 11, "steps": 3,
            "cfg_scale": 6, "width": 64, "height": 64, "sampler_name": "Euler a",
            "override_settings": {"sd_model_checkpoint": "sdxl"}}  # fmt: skip
    res = http.post("/sdapi/v1/txt2img", json=body).json()
    ours = np.array(decoded(res["images"][0]).convert("RGB"))
    theirs = direct(
        folders["sdxl"], 11, prompt="a red fox in snow", negative_prompt="blurry",
        num_inference_steps=3, guidance_scale=6.0, width=64, height=64,
    )  # fmt: skip
    assert np.array_equal(ours, theirs)
    assert json.loads(res["info"])["sd_model_name"] == "sdxl"  # override_settings, this call
    assert "warnings" not in json.loads(res["info"])


def test_an_empty_prompt_is_drawn_as_a1111_draws_it(http):
    # A1111's own default prompt is "" (img2img is often called with none)
    res = http.post("/sdapi/v1/txt2img", json={"steps": 1, "width": 64, "height": 64})
    assert res.status_code == 200 and decoded(res.json()["images"][0]).size == (64, 64)


def test_a_prompt_past_the_text_encoders_window_is_told_in_info(http):
    body = {"prompt": "a" * 80 + " tail", "steps": 1, "width": 64, "height": 64}
    info = json.loads(http.post("/sdapi/v1/txt2img", json=body).json()["info"])
    (warning,) = info["warnings"]
    assert warning.startswith("prompt is longer") and warning.endswith("'aaaaa tail'")


def test_img2img_and_inpainting_are_the_pipelines_own(http, folders):
    init = picture()
    mask = np.zeros((64, 64), np.uint8)
    mask[8:40, 8:40] = 255  # A1111's mask: white repaints
    body = {"prompt": "a boat", "seed": 2, "steps": 4, "width": 64, "height": 64,
            "sampler_name": "Euler", "cfg_scale": 7,
            "init_images": ["data:image/png;base64," + base64.b64encode(png(init)).decode()],
            "denoising_strength": 0.5}  # fmt: skip
    res = http.post("/sdapi/v1/img2img", json=body).json()
    image = decoded(res["images"][0])
    assert "Denoising strength: 0.5" in image.info["parameters"]
    masked = http.post(
        "/sdapi/v1/img2img", json=body | {"mask": base64.b64encode(png(mask)).decode()}
    ).json()
    inverted = http.post(
        "/sdapi/v1/img2img",
        json=body
        | {"mask": base64.b64encode(png(255 - mask)).decode(), "inpainting_mask_invert": 1},
    ).json()
    assert masked["images"] == inverted["images"]
    theirs = direct_edit(
        folders["sd15"], 2, prompt="a boat", image=Image.fromarray(init), strength=0.5,
        num_inference_steps=4, guidance_scale=7.0, scheduler_class="EulerDiscreteScheduler",
    )  # fmt: skip
    assert np.array_equal(np.array(image.convert("RGB")), theirs)
    theirs_masked = direct_edit(
        folders["sd15"], 2, mask=mask, prompt="a boat", image=Image.fromarray(init),
        strength=0.5, num_inference_steps=4, guidance_scale=7.0, width=64, height=64,
        scheduler_class="EulerDiscreteScheduler",
    )  # fmt: skip
    assert np.array_equal(np.array(decoded(masked["images"][0]).convert("RGB")), theirs_masked)


LONG = 150


def test_progress_shows_the_current_job_and_interrupt_stops_it(http, live):
    """A long txt2img (512², 150 steps): /progress shows its step, an ETA and a latent
    preview; /interrupt stops it within a few steps, and it answers with its image."""
    answers: list[httpx.Response] = []
    body = {"prompt": "a long road", "seed": 0, "steps": LONG, "width": 512, "height": 512}
    thread = threading.Thread(
        target=lambda: answers.append(httpx.post(live.url + "/sdapi/v1/txt2img", json=body,
                                                 timeout=300))
    )  # fmt: skip
    thread.start()
    wait_until(
        lambda: http.get("/sdapi/v1/progress").json()["state"]["sampling_step"] >= 2, 60, "steps"
    )
    seen = http.get("/sdapi/v1/progress").json()
    state = seen["state"]
    assert state["job_count"] == 1 and not state["interrupted"]
    assert state["sampling_steps"] in (LONG, LONG + 1)  # PNDM runs one more timestep
    assert 0 < seen["progress"] < 0.5 and seen["eta_relative"] > 0
    preview = decoded(seen["current_image"])
    assert (preview.format, preview.size) == ("PNG", (64, 64))  # the latents' size
    step = state["sampling_step"]
    assert http.post("/sdapi/v1/interrupt").status_code == 200
    last = step
    while thread.is_alive():
        now = http.get("/sdapi/v1/progress").json()["state"]
        last = max(last, now["sampling_step"])
        thread.join(timeout=0.02)
    assert last - step <= 10, (step, last)  # stopped, not the 150 it asked for
    assert answers[0].status_code == 200
    assert decoded(answers[0].json()["images"][0]).size == (512, 512)
    idle = http.get("/sdapi/v1/progress").json()
    assert (idle["progress"], idle["state"]["job_count"], idle["current_image"]) == (0, 0, None)


def test_another_caller_neither_sees_nor_interrupts_a_job(http, live):
    """A job from 127.0.0.1 and a caller from 127.0.0.2 (another address, as another
    machine would be): its /progress shows no job and no preview, its /interrupt says it
    stopped nothing and the job steps on; then the owner's /interrupt stops it. Before,
    any caller read the job's preview and stopped it."""
    answers: list[httpx.Response] = []
    body = {"prompt": "a long road", "seed": 0, "steps": LONG, "width": 512, "height": 512}
    thread = threading.Thread(
        target=lambda: answers.append(httpx.post(live.url + "/sdapi/v1/txt2img", json=body,
                                                 timeout=300))
    )  # fmt: skip
    thread.start()

    def step() -> int:
        return int(http.get("/sdapi/v1/progress").json()["state"]["sampling_step"])

    wait_until(lambda: step() >= 2, 60, "steps")
    other = httpx.Client(
        base_url=live.url, timeout=60, transport=httpx.HTTPTransport(local_address="127.0.0.2")
    )
    with other:
        seen = other.get("/sdapi/v1/progress").json()
        assert (seen["state"]["job_count"], seen["current_image"], seen["progress"]) == (0, None, 0)
        refused = other.post("/sdapi/v1/interrupt")
        assert refused.status_code == 200 and refused.json()["interrupted"] is False
        at_refusal = step()
        wait_until(lambda: step() >= at_refusal + 15, 120, "steps past the other's interrupt")
        assert http.get("/sdapi/v1/progress").json()["state"]["interrupted"] is False
    stopped = http.post("/sdapi/v1/interrupt")
    assert stopped.json()["interrupted"] is True  # the owner's own: the control
    thread.join(timeout=120)
    assert answers[0].status_code == 200
    assert step() == 0  # no job of anyone's is left


def test_fields_a1111_clients_add_are_ignored(http):
    body = {"prompt": "a cat", "steps": 1, "width": 64, "height": 64, "enable_hr": False,
            "restore_faces": False, "tiling": False, "s_churn": 0.0, "do_not_add_watermark": True,
            "styles": [], "subseed": -1, "send_images": True, "save_images": False,
            "sampler_index": "Euler", "alwayson_scripts": {}}  # fmt: skip
    answer = http.post("/sdapi/v1/txt2img", json=body)
    assert answer.status_code == 200, answer.json()
    assert "Sampler: Euler," in decoded(answer.json()["images"][0]).info["parameters"]


NOT_AN_IMAGE = base64.b64encode(b"not an image").decode()
BAD = [
    ("txt2img", {"width": 60}, "size", "invalid_size", 400),
    ("txt2img", {"sampler_name": "Warp"}, "sampler_name", "invalid_request", 400),
    ("txt2img", {"sampler_name": "DDIM", "scheduler": "Karras"}, "sampler_name",
     "invalid_request", 400),
    ("txt2img", {"scheduler": "Exponential"}, "scheduler", "invalid_request", 400),
    ("txt2img", {"enable_hr": True}, "enable_hr", "invalid_request", 400),
    ("txt2img", {"steps": 0}, "steps", "invalid_request", 400),
    ("txt2img", {"batch_size": 5}, "n", "invalid_request", 400),  # beyond max_batch 4
    ("txt2img", {"override_settings": {"sd_model_checkpoint": "nobody"}},
     "sd_model_checkpoint", "model_not_found", 404),
    ("img2img", {"init_images": ["%%%"]}, "init_images", "invalid_request", 400),
    ("img2img", {"init_images": [NOT_AN_IMAGE]}, "image", "invalid_image", 400),
    ("img2img", {"denoising_strength": 0.001}, "denoising_strength", "invalid_request", 400),
    ("img2img", {"init_images": []}, "init_images", "invalid_request", 400),
]  # fmt: skip


@pytest.mark.parametrize(("route", "change", "param", "code", "status"), BAD)
def test_bad_input_gets_a_clear_error_and_nothing_is_queued(
    http, live, route, change, param, code, status
):
    body = {"prompt": "a cat", "steps": 2, "width": 64, "height": 64}
    if route == "img2img":
        body["init_images"] = [base64.b64encode(png(picture())).decode()]
    answer = http.post(f"/sdapi/v1/{route}", json=body | change)
    error = answer.json()["error"]
    assert (error["param"], error["code"], answer.status_code) == (param, code, status), error
    state = live.status()
    assert state["queue"]["depth"] == 0 and state["pool"]["admitted_bytes"] == 0


def test_choosing_a_checkpoint_not_served_is_refused(http):
    answer = http.post("/sdapi/v1/options", json={"sd_model_checkpoint": "nobody [abc123]"})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"
    assert http.get("/sdapi/v1/options").json()["sd_model_checkpoint"] == "sd15"
    titled = http.post("/sdapi/v1/options", json={"sd_model_checkpoint": "sdxl [0f1e2d]"})
    assert titled.status_code == 200
    assert http.get("/sdapi/v1/options").json()["sd_model_checkpoint"] == "sdxl"
    http.post("/sdapi/v1/options", json={"sd_model_checkpoint": "sd15"}).raise_for_status()


def test_a_client_that_leaves_stops_its_job(http, live):
    host, port = live.url.removeprefix("http://").split(":")
    data = json.dumps(
        {"prompt": "a long road", "seed": 0, "steps": LONG, "width": 512, "height": 512}
    ).encode()
    connection = socket.create_connection((host, int(port)))
    connection.sendall(
        f"POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    wait_until(
        lambda: http.get("/sdapi/v1/progress").json()["state"]["sampling_step"] >= 2, 60, "steps"
    )
    step = http.get("/sdapi/v1/progress").json()["state"]["sampling_step"]
    connection.close()
    last = step
    while (now := http.get("/sdapi/v1/progress").json()["state"])["job_count"]:
        last = max(last, now["sampling_step"])
    assert last - step <= 10, (step, last)  # its run stopped, and its job is gone
    assert http.get("/sdapi/v1/progress").json()["state"]["job_count"] == 0
