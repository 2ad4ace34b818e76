"""The diffusion handler on tiny random pipelines built here (SD 1.5- and SDXL-shaped, saved
with diffusers' own save_pretrained), on the CPU: its pixels are the pipeline's own for
the same seeds, rows of one shape batch, progress is reported and a run whose clients
all left stops early."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from app.engine.device import CpuDevice
from app.errors import InvalidImageSize
from app.models.diffusion import DiffusionHandler
from app.models.image_prompt import ImageProgress, ImagePrompt
from app.settings import ModelSpec
from tests.random_models import save_random_sd15, save_random_sdxl

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
