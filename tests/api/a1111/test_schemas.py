"""AUTOMATIC1111's bodies without a server: sampler names and aliases (1.9's separate
Karras scheduler), unknown fields ignored, refused ones named, and the PNG `parameters`
chunk as Pillow (and A1111's PNG Info) reads it back."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from app.api.a1111.routes import infotext, with_text
from app.api.a1111.schemas import SAMPLERS, Txt2ImgRequest, sampler_of
from app.errors import InvalidRequest
from app.models.image_prompt import SCHEDULERS
from app.models.images import encode_png


@pytest.mark.parametrize(
    ("name", "scheduler", "expected"),
    [
        (None, None, "Euler a"),
        ("Euler a", "Automatic", "Euler a"),
        ("k_euler_a", None, "Euler a"),
        ("DPM++ 2M", "Karras", "DPM++ 2M Karras"),
        ("DPM++ 2M Karras", "karras", "DPM++ 2M Karras"),
        ("PLMS", None, "PLMS"),
    ],
)
def test_sampler_names_aliases_and_the_karras_scheduler(name, scheduler, expected):
    assert sampler_of(name, scheduler) == expected


@pytest.mark.parametrize(
    ("name", "scheduler", "param"),
    [("Warp", None, "sampler_name"), ("DDIM", "Karras", "sampler_name"),
     ("Euler", "Exponential", "scheduler")],
)  # fmt: skip
def test_unknown_samplers_and_schedulers_are_refused(name, scheduler, param):
    with pytest.raises(InvalidRequest) as raised:
        sampler_of(name, scheduler)
    assert raised.value.param == param


def test_every_sampler_is_one_of_our_schedulers():
    assert set(SAMPLERS.values()) <= set(SCHEDULERS)


def test_unknown_fields_are_ignored_and_refused_ones_named_when_they_ask():
    body = Txt2ImgRequest.model_validate(
        {"prompt": "a cat", "s_noise": 1.0, "enable_hr": False, "alwayson_scripts": {}}
    )
    assert (body.steps, body.cfg_scale, body.width, body.sampler) == (50, 7.0, 512, "Euler a")
    with pytest.raises(InvalidRequest) as raised:
        Txt2ImgRequest.model_validate({"prompt": "a cat", "enable_hr": True})
    assert raised.value.param == "enable_hr"


def test_the_parameters_chunk_reads_back_latin_1_or_not():
    png = encode_png(np.zeros((8, 8, 3), np.uint8))
    body = Txt2ImgRequest.model_validate(
        {"prompt": "a cat", "negative_prompt": "blurry", "steps": 20, "width": 64, "height": 64}
    )
    text = infotext(body, "sd15", 7, None)
    assert text == (
        "a cat\nNegative prompt: blurry\n"
        "Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 7, Size: 64x64, Model: sd15"
    )
    for written in (text, "ein Kätzchen", "猫 (a cat)"):
        with Image.open(io.BytesIO(with_text(png, "parameters", written))) as image:
            image.load()  # every chunk's CRC is checked
            assert image.info["parameters"] == written
    plain = Txt2ImgRequest.model_validate({"prompt": "a cat"})
    assert "Negative prompt" not in infotext(plain, "sd15", 1, 0.5)
    assert infotext(plain, "sd15", 1, 0.5).endswith(", Denoising strength: 0.5")
