"""The latent2rgb preview: a fixed linear map of the 4 latent channels to RGB (ComfyUI's
tables), from [-1, 1] to 0..255, clamped; SDXL's table has a bias, SD 1.5's none."""

from __future__ import annotations

import numpy as np
import torch

from app.engines.torch.diffusion.preview import (
    SD15_FACTORS,
    SDXL_BIAS,
    SDXL_FACTORS,
    latent_previews,
    table_for,
)


def test_each_channel_maps_through_its_row_of_the_table():
    latents = np.zeros((1, 4, 2, 3), dtype=np.float32)
    latents[0, 1] = 1.0  # only channel 1, everywhere
    (preview,) = latent_previews(latents, (SD15_FACTORS, np.zeros(3, np.float32)))
    expected = np.round((SD15_FACTORS[1] + 1) / 2 * 255).astype(np.uint8)
    assert preview.shape == (2, 3, 3) and preview.dtype == np.uint8
    assert (preview == expected).all()


def test_sdxl_adds_its_bias_and_values_beyond_the_range_are_clamped():
    zero = np.zeros((1, 4, 1, 1), dtype=np.float32)
    (biased,) = latent_previews(zero, (SDXL_FACTORS, SDXL_BIAS))
    assert biased[0, 0].tolist() == np.round((SDXL_BIAS + 1) / 2 * 255).astype(int).tolist()
    huge = np.full((1, 4, 1, 1), 100.0, dtype=np.float32)
    (clamped,) = latent_previews(huge, (SD15_FACTORS, np.zeros(3, np.float32)))
    signs = SD15_FACTORS.sum(axis=0) > 0
    assert clamped[0, 0].tolist() == [255 if s else 0 for s in signs]


def test_a_batch_of_torch_latents_gives_one_preview_a_row_and_tables_by_pipeline():
    latents = torch.randn(3, 4, 8, 6, generator=torch.Generator().manual_seed(0))
    previews = latent_previews(latents, (SD15_FACTORS, np.zeros(3, np.float32)))
    assert [p.shape for p in previews] == [(8, 6, 3)] * 3
    assert not np.array_equal(previews[0], previews[1])
    assert table_for("StableDiffusionXLPipeline")[0] is SDXL_FACTORS  # type: ignore[index]
    assert table_for("StableDiffusionPipeline")[0] is SD15_FACTORS  # type: ignore[index]
    assert table_for("FluxPipeline") is None  # 16-channel latents: no table


def test_latents_of_another_channel_count_get_no_preview_not_an_error():
    # SD3's 16-channel latents: its class name holds "StableDiffusion", the table is 4 rows
    table = table_for("StableDiffusion3Pipeline")
    assert table is not None
    assert latent_previews(torch.zeros(1, 16, 8, 8), table) == []
