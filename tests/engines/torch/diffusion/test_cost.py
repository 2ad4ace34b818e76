"""The first quote of a diffusion run, from the pipeline's own configs (pure): Stable
Diffusion 1.5's and XL's published UNet and VAE configs, in float16."""

from __future__ import annotations

from app.engines.torch.diffusion.cost import (
    DiffusionGeometry,
    decoding_bytes,
    denoising_bytes,
    image_bytes,
    tiled_decoding_bytes,
)

GiB = 2**30
SD15_UNET = {
    "block_out_channels": [320, 640, 1280, 1280],
    "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
    "attention_head_dim": 8,
}
SDXL_UNET = {
    "block_out_channels": [320, 640, 1280],
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "attention_head_dim": [5, 10, 20],
}
VAE = {"block_out_channels": [128, 256, 512, 512], "sample_size": 512}


def sd15() -> DiffusionGeometry:
    return DiffusionGeometry.from_configs(SD15_UNET, VAE, 8, 2, vae_upcast=False)


def sdxl() -> DiffusionGeometry:
    return DiffusionGeometry.from_configs(SDXL_UNET, VAE, 8, 2, vae_upcast=True)


def test_geometry_is_read_from_the_configs():
    assert (sd15().unet_channels, sd15().vae_channels, sd15().vae_element) == (320, 128, 2)
    assert sdxl().vae_element == 4  # SDXL's VAE decodes in float32 (force_upcast)


def test_the_full_resolution_decode_dominates_and_grows_with_pixels():
    for geometry in (sd15(), sdxl()):
        for side in (512, 768, 1024):
            decode = decoding_bytes(geometry, side, side, 1)
            assert decode > denoising_bytes(geometry, side, side, 2)
        quotes = [image_bytes(geometry, side, side, 1) for side in (512, 768, 1024)]
        assert quotes[0] < quotes[1] < quotes[2]
        assert image_bytes(geometry, 512, 512, 2) > quotes[0]  # a batch of two costs more


def test_sdxl_grows_at_least_as_fast_as_its_measured_peaks():
    """The design's measured SDXL peaks grow by 3.1 GB from 512² to 1024²: the quote is
    to err above, so it grows at least as much."""
    grown = image_bytes(sdxl(), 1024, 1024, 1) - image_bytes(sdxl(), 512, 512, 1)
    assert grown >= 3.1e9
    assert image_bytes(sdxl(), 1024, 1024, 1) < 8 * GiB  # and stays within reason
    assert image_bytes(sd15(), 512, 512, 1) < GiB


def test_without_guidance_the_unet_runs_one_row_per_image():
    geometry = sd15()
    assert denoising_bytes(geometry, 512, 512, 2) == 2 * denoising_bytes(geometry, 512, 512, 1)
    assert image_bytes(geometry, 256, 256, 1, guided=False) <= image_bytes(geometry, 256, 256, 1)


def test_a_tiled_decode_costs_a_tile_not_the_image():
    geometry = sd15()
    assert geometry.vae_tile == 512
    whole, tiled = (image_bytes(geometry, 1024, 1024, 1, tiled=t) for t in (False, True))
    assert tiled < whole / 3  # a 512² tile's decode, not a 1024² one's
    assert tiled >= decoding_bytes(geometry, 512, 512, 1)
    # at the tile's size or under, tiling saves nothing (diffusers does not tile it)
    small = tiled_decoding_bytes(geometry, 512, 512, 1)
    assert small >= decoding_bytes(geometry, 512, 512, 1)
    assert image_bytes(geometry, 512, 512, 1, tiled=True) >= image_bytes(geometry, 512, 512, 1)
