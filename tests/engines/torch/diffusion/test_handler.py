"""The diffusion handler on tiny random pipelines built here (SD 1.5- and SDXL-shaped, saved
with diffusers' own save_pretrained), on the CPU: its pixels are the pipeline's own for
the same seeds, rows of one shape batch, progress is reported and a run whose clients
all left stops early."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from app.config.settings import ModelSpec
from app.devices.cpu import CpuDevice
from app.engines.torch.diffusion.handler import DiffusionHandler
from app.errors import InvalidImageSize
from app.models.image_prompt import ImageProgress, ImagePrompt
from tests.support.random_models import save_random_sd15, save_random_sdxl

BUILDERS = {"sd15": save_random_sd15, "sdxl": save_random_sdxl}


@pytest.fixture(scope="module", params=list(BUILDERS))
def loaded(request, tmp_path_factory) -> DiffusionHandler:
    folder = BUILDERS[request.param](tmp_path_factory.mktemp(request.param))
    spec = ModelSpec(name=request.param, kind="diffusion", path=folder, max_batch=4)
    handler = DiffusionHandler(spec)
    handler.load(CpuDevice())
    return handler


def direct(handler: DiffusionHandler, prompts: list[str], seeds: list[int], **extra) -> np.ndarray:
    """The pipeline called directly, as its users call it, to uint8 pixels."""
    from diffusers import AutoPipelineForText2Image

    pipeline = AutoPipelineForText2Image.from_pretrained(handler.path, local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    images = pipeline(prompts, generator=generators, output_type="np", **extra).images
    return (images * 255).round().astype(np.uint8)


def run(handler: DiffusionHandler, rows: list[ImagePrompt]) -> list[np.ndarray]:
    return [pixels for pixels, _ in handler.forward(handler.preprocess(rows))]


def test_a_row_is_the_pipelines_own_image_for_its_seed(loaded):
    rows = [ImagePrompt("a red cat", seed=7, steps=2), ImagePrompt("a red cat", seed=8, steps=2)]
    ours = run(loaded, rows)
    theirs = direct(loaded, ["a red cat"] * 2, [7, 8], num_inference_steps=2)
    assert ours[0].shape == (64, 64, 3)  # the model's default size
    assert np.array_equal(np.stack(ours), theirs)
    assert not np.array_equal(ours[0], ours[1])  # another seed, another image


def test_requests_of_one_shape_merge_and_keep_their_own_prompts_and_seeds(loaded):
    one = loaded.preprocess([ImagePrompt("a boat", seed=1, steps=2, width=64, height=96)])
    two = loaded.preprocess([ImagePrompt("a tree", seed=5, steps=2, width=64, height=96)])
    other = loaded.preprocess([ImagePrompt("a tree", seed=5, steps=3, width=64, height=96)])
    merged = loaded.merge([one, two])
    assert merged is not None and merged.bucket.label == "px64x96xb2" and merged.count == 2
    assert loaded.merge([one, other]) is None  # other steps: not one batch
    assert loaded.merge([one, two, two, two, two]) is None  # beyond max_batch (4)
    pixels = [p for p, _ in loaded.forward(merged)]
    theirs = direct(
        loaded, ["a boat", "a tree"], [1, 5], num_inference_steps=2, width=64, height=96
    )
    assert pixels[0].shape == (96, 64, 3)
    assert np.array_equal(np.stack(pixels), theirs)


def test_progress_is_reported_and_a_run_whose_clients_left_stops_early(loaded):
    watched, left = ImageProgress(), ImageProgress()
    left.cancel()
    run(loaded, [ImagePrompt("a hill", seed=0, steps=4, progress=watched)])
    run(loaded, [ImagePrompt("a hill", seed=0, steps=4, progress=left)])
    done, total = watched.read()
    assert done == total >= 4  # the scheduler's timesteps (PNDM's are one more than steps)
    assert left.read() == (1, total)  # stopped after its first step
    assert loaded.running() == []  # nothing left behind in /status


def test_sizes_off_the_grid_or_beyond_the_bounds_are_refused(loaded):
    with pytest.raises(InvalidImageSize):
        loaded.preprocess([ImagePrompt("x", seed=0, width=60, height=64)])
    loaded.max_pixels = 128 * 128
    try:
        with pytest.raises(InvalidImageSize):
            loaded.preprocess([ImagePrompt("x", seed=0, width=256, height=128)])
    finally:
        loaded.max_pixels = 2**24


def test_the_first_quote_grows_with_size_and_batch_and_weights_are_known_before_loading(
    loaded, tmp_path: Path
):
    quotes = [
        loaded.prior_bytes(loaded.preprocess([ImagePrompt("x", seed=0, width=s, height=s)]).bucket)
        for s in (64, 128, 256)
    ]
    assert 0 < quotes[0] < quotes[1] < quotes[2]
    pair = loaded.preprocess([ImagePrompt("x", seed=i, width=64, height=64) for i in range(2)])
    assert loaded.prior_bytes(pair.bucket) > quotes[0]
    expected, loaded_bytes = loaded.expected_weights_bytes(CpuDevice()), loaded.weights_bytes()
    assert abs(expected - loaded_bytes) <= 0.01 * loaded_bytes  # buffers are not saved


def init_picture(width: int = 64, height: int = 64, seed: int = 3) -> np.ndarray:
    """A smooth RGB picture (random noise would make every strength look alike)."""
    rng = np.random.default_rng(seed)
    corners = rng.integers(0, 256, size=(2, 2, 3)).astype(np.float32)
    ys, xs = np.linspace(0, 1, height)[:, None, None], np.linspace(0, 1, width)[None, :, None]
    top = corners[0, 0] * (1 - xs) + corners[0, 1] * xs
    bottom = corners[1, 0] * (1 - xs) + corners[1, 1] * xs
    return (top * (1 - ys) + bottom * ys).round().astype(np.uint8)


def direct_task(handler: DiffusionHandler, task: str, prompts, seeds, **extra) -> np.ndarray:
    """diffusers' image-to-image or inpainting pipeline loaded and called directly, with
    PIL images as its users give them."""
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting

    auto = AutoPipelineForImage2Image if task == "image2image" else AutoPipelineForInpainting
    pipeline = auto.from_pretrained(handler.path, local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    images = pipeline(prompts, generator=generators, output_type="np", **extra).images
    return (images * 255).round().astype(np.uint8)


def test_an_init_image_row_is_the_image_to_image_pipelines_own_for_its_seed(loaded):
    from PIL import Image

    picture = init_picture()
    rows = [
        ImagePrompt("a red cat", seed=s, steps=4, strength=0.5, init_image=picture, width=64,
                    height=64)
        for s in (7, 8)
    ]  # fmt: skip
    ours = np.stack(run(loaded, rows))
    theirs = direct_task(
        loaded, "image2image", ["a red cat"] * 2, [7, 8], image=[Image.fromarray(picture)] * 2,
        strength=0.5, num_inference_steps=4,
    )  # fmt: skip
    assert np.array_equal(ours, theirs)
    plain = np.stack(run(loaded, [replace(r, init_image=None, strength=None) for r in rows]))
    assert not np.array_equal(ours, plain)  # the init image made a difference


def test_a_masked_row_is_the_inpainting_pipelines_own_and_keeps_what_is_unmasked(loaded):
    from PIL import Image

    picture, mask = init_picture(), np.zeros((64, 64), dtype=np.uint8)
    mask[16:48, 16:48] = 255  # repaint the middle
    row = ImagePrompt(
        "a boat", seed=4, steps=3, strength=1.0, init_image=picture, mask=mask, width=64,
        height=64,
    )  # fmt: skip
    (ours,) = run(loaded, [row])
    theirs = direct_task(
        loaded, "inpainting", ["a boat"], [4], image=Image.fromarray(picture),
        mask_image=Image.fromarray(mask), strength=1.0, num_inference_steps=3, width=64,
        height=64,
    )  # fmt: skip
    assert np.array_equal(ours, theirs[0])


def test_tasks_and_strengths_never_share_a_batch_and_have_buckets_of_their_own(loaded):
    picture = init_picture()
    plain = loaded.preprocess([ImagePrompt("a", seed=0, steps=2, width=64, height=64)])
    half = loaded.preprocess(
        [ImagePrompt("a", seed=0, steps=2, width=64, height=64, init_image=picture, strength=0.5)]
    )
    other = loaded.preprocess(
        [ImagePrompt("a", seed=1, steps=2, width=64, height=64, init_image=picture, strength=0.7)]
    )
    masked = loaded.preprocess(
        [ImagePrompt("a", seed=0, steps=2, width=64, height=64, init_image=picture,
                     strength=0.5, mask=np.zeros((64, 64), np.uint8))]
    )  # fmt: skip
    assert loaded.merge([plain, half]) is None
    assert loaded.merge([half, other]) is None
    assert loaded.merge([half, masked]) is None
    assert half.bucket.label == "px64x64xb1~image2image"
    assert masked.bucket.label == "px64x64xb1~inpainting"
    assert loaded.prior_bytes(half.bucket) == loaded.prior_bytes(plain.bucket) > 0


def test_an_init_image_of_another_size_is_resized_to_the_rows_size(loaded):
    row = ImagePrompt("a", seed=2, steps=2, strength=0.6, init_image=init_picture(80, 48),
                      width=64, height=96)  # fmt: skip
    (pixels,) = run(loaded, [row])
    assert pixels.shape == (96, 64, 3)


def test_a_run_that_asks_for_previews_gets_latent_previews_of_its_own_rows(loaded):
    watched, blind = ImageProgress(previews=True), ImageProgress()
    rows = [
        ImagePrompt("a hill", seed=0, steps=3, width=64, height=96, progress=watched),
        ImagePrompt("a hill", seed=1, steps=3, width=64, height=96, progress=watched),
        ImagePrompt("a hill", seed=2, steps=3, width=64, height=96, progress=blind),
    ]
    merged = loaded.merge([loaded.preprocess(rows[:2]), loaded.preprocess(rows[2:])])
    assert merged is not None
    loaded.forward(merged)
    step, previews = watched.preview()
    assert 1 <= step <= watched.read()[0]  # the first step's, at least (then every 0.5 s)
    assert [p.shape for p in previews] == [(12, 8, 3)] * 2  # the latents' size, RGB
    assert all(p.dtype == np.uint8 for p in previews)
    assert not np.array_equal(previews[0], previews[1])  # each row its own
    assert blind.preview()[1] == []  # computed only for those who asked


def test_a_tiled_run_is_the_pipelines_own_with_vae_tiling_on_and_costs_less(loaded):
    # the tiny VAE tiles at 64 pixels (its sample_size): 128² decodes in four tiles
    whole = loaded.preprocess([ImagePrompt("a bay", seed=3, steps=2, width=128, height=128)])
    tiled = loaded.leaner(whole)
    assert tiled is not None and tiled.bucket.label == "px128x128xb1~tiled"
    assert loaded.prior_bytes(tiled.bucket) < loaded.prior_bytes(whole.bucket)
    (ours,) = [pixels for pixels, _ in loaded.forward(tiled)]
    (plain,) = [pixels for pixels, _ in loaded.forward(whole)]

    from diffusers import AutoPipelineForText2Image

    pipeline = AutoPipelineForText2Image.from_pretrained(loaded.path, local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    pipeline.vae.enable_tiling()  # as users tile a decode
    theirs = pipeline(
        "a bay", generator=torch.Generator().manual_seed(3), num_inference_steps=2,
        width=128, height=128, output_type="np",
    ).images[0]  # fmt: skip
    assert np.array_equal(ours, (theirs * 255).round().astype(np.uint8))
    assert not np.array_equal(ours, plain)  # the tiles' seams blended: not the whole decode
    assert not loaded._pipeline.vae.use_tiling  # the loaded VAE is untouched
    at_tile = loaded.preprocess([ImagePrompt("x", seed=0, width=64, height=64)])
    assert loaded.leaner(at_tile) is None  # one tile: tiling saves nothing


@pytest.mark.parametrize("task", ["image2image", "inpainting"])
def test_an_edit_runs_over_the_loaded_modules_with_a_scheduler_of_its_own(loaded, task):
    from app.engines.torch.diffusion.pipeline import for_run

    base = loaded._pipeline
    run = for_run(base, "euler_a", task)
    assert "Img2Img" in type(run).__name__ or "Inpaint" in type(run).__name__
    shared = [
        name
        for name in ("unet", "vae", "text_encoder")
        if getattr(run, name) is getattr(base, name)
    ]
    assert shared == ["unet", "vae", "text_encoder"]  # the same modules: no second copy
    # its own tokenizer (a fast one's truncation is state its calls set), as the loop's
    assert run.tokenizer is not base.tokenizer and loaded._tokenizer is not base.tokenizer
    assert type(run.scheduler).__name__ == "EulerAncestralDiscreteScheduler"  # its own
    assert type(base.scheduler).__name__ != "EulerAncestralDiscreteScheduler"  # untouched


def test_only_a_pipeline_that_upcasts_its_vae_is_quoted_a_float32_decode(tmp_path):
    # AutoencoderKL's config says force_upcast by default, but only SDXL's pipelines act
    # on it: an SD 1.5 in float16 decodes in float16 (its quote was twice the truth)
    handlers = {}
    for name, build in BUILDERS.items():
        spec = ModelSpec(name=name, kind="diffusion", path=build(tmp_path / name), dtype="float16")
        handlers[name] = DiffusionHandler(spec)
        handlers[name].load(CpuDevice())
    assert handlers["sd15"]._pipeline.vae.config.force_upcast  # the config says it...
    assert not handlers["sd15"].upcasts and handlers["sd15"]._geometry.vae_element == 2
    assert handlers["sdxl"].upcasts and handlers["sdxl"]._geometry.vae_element == 4
