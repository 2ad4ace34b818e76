"""A cheap preview of a running diffusion: its latents mapped to RGB by a fixed linear
table, as AUTOMATIC1111's and ComfyUI's "latent2rgb" previews do, at the latents' size
(1/8 of the image a side). No VAE runs, so a preview costs next to nothing beside a step.

The tables are ComfyUI's (`latent_formats.SD15`, `latent_formats.SDXL`): each latent
channel's contribution to R, G and B, fitted against VAE decodes; SDXL's has a bias.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# rows: latent channels 0..3; columns: R, G, B
SD15_FACTORS = np.array(
    [
        [0.3512, 0.2297, 0.3227],
        [0.3250, 0.4974, 0.2350],
        [-0.2829, 0.1762, 0.2721],
        [-0.2120, -0.2616, -0.7177],
    ],
    dtype=np.float32,
)
SD15_BIAS = np.zeros(3, dtype=np.float32)
SDXL_FACTORS = np.array(
    [
        [0.3651, 0.4232, 0.4341],
        [-0.2533, -0.0042, 0.1068],
        [0.1076, 0.1111, -0.0362],
        [-0.3165, -0.2492, -0.2188],
    ],
    dtype=np.float32,
)
SDXL_BIAS = np.array([0.1084, -0.0175, -0.0011], dtype=np.float32)


def table_for(pipeline_class: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The (factors, bias) for a pipeline class's 4-channel latents; None: no table."""
    if "XL" in pipeline_class:
        return SDXL_FACTORS, SDXL_BIAS
    if "StableDiffusion" in pipeline_class:
        return SD15_FACTORS, SD15_BIAS
    return None


def latent_previews(latents: Any, table: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    """Each row's preview, HWC uint8 RGB, from latents shaped (batch, 4, h, w) (a torch
    tensor on any device, or an array): x·factors + bias, mapped from [-1, 1] to 0..255.
    None of them for latents of another channel count (SD3's 16: a pipeline whose class name
    matched a table it does not fit): no preview rather than a failed run."""
    if latents.shape[1] != table[0].shape[0]:
        return []
    if hasattr(latents, "detach"):
        latents = latents.detach().float().cpu().numpy()
    factors, bias = table
    rgb = np.einsum("bchw,cr->bhwr", np.asarray(latents, dtype=np.float32), factors) + bias
    scaled = ((rgb + 1.0) / 2.0).clip(0.0, 1.0) * 255.0
    return list(scaled.round().astype(np.uint8))
