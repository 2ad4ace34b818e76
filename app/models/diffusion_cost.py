"""A diffusion pipeline's first quote for an image size, from its own configs, before any
run has been measured. Pure: the numbers come from the UNet's and the VAE's config.json.

A text-to-image run has two phases that never hold memory at the same time:

- **denoising**: the UNet runs on the latents (1/`scale` of the image a side), twice
  over the batch with classifier-free guidance. Its largest activations are at its
  first level: the convolutions' feature maps (`UNET_LIVE` maps of `unet[0]` channels
  alive at once), and where that level attends, the attention matrix, counted as if
  materialised (tokens² × heads), which memory-efficient kernels avoid: an upper bound.
- **decoding**: the VAE decoder upsamples the latents to full resolution; its last
  level runs `vae[0]` channels at every pixel, with `VAE_LIVE` such maps alive at once
  (a resnet block's input, its two norms and convolutions, the upsampler's output and
  the convolution's workspace), plus its mid-block's single-head attention over the
  latent tokens (tokens², materialised, again an upper bound). At 1024² this phase
  dominates: SD 1.5's decoder holds 128 channels at a million pixels.

Quote = max(denoising, decoding). The constants are chosen to be over rather than under
(the design's figures for SDXL grow by about 4 KiB a pixel from 512² to 1024²; this
formula gives 4 KiB a pixel for its float32 decoder alone); every run then teaches the
bucket its measured peak, which replaces the quote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

UNET_LIVE = 6  # feature maps of the first level alive at once in a UNet step
VAE_LIVE = 8  # full-resolution feature maps alive at once in the VAE decoder's last level


@dataclass(frozen=True)
class DiffusionGeometry:
    """What the quote needs of a pipeline: channels per level, attention, scales, and the
    element sizes its UNet and VAE run in."""

    scale: int  # image pixels per latent pixel, a side (the VAE's downsampling)
    unet_channels: int  # the UNet's first level
    unet_attention_level: int | None  # the first level that attends (None: none does)
    unet_heads: int
    vae_channels: int  # the VAE decoder's last (full-resolution) level
    unet_element: int  # bytes per element
    vae_element: int

    @staticmethod
    def from_configs(
        unet: dict[str, Any], vae: dict[str, Any], scale: int, element: int, vae_upcast: bool
    ) -> DiffusionGeometry:
        """From the UNet's and VAE's configs; `vae_upcast`: the VAE decodes in float32
        whatever the pipeline's dtype (SDXL's `force_upcast`)."""
        blocks = list(unet.get("down_block_types") or [])
        attends = [i for i, name in enumerate(blocks) if "Attn" in str(name)]
        level = attends[0] if attends else None
        heads = unet.get("num_attention_heads") or unet.get("attention_head_dim") or 8
        if isinstance(heads, list | tuple):
            heads = heads[level or 0]
        return DiffusionGeometry(
            scale=scale,
            unet_channels=int((unet.get("block_out_channels") or [320])[0]),
            unet_attention_level=level,
            unet_heads=int(heads),
            vae_channels=int((vae.get("block_out_channels") or [128])[0]),
            unet_element=element,
            vae_element=4 if vae_upcast else element,
        )


def denoising_bytes(geometry: DiffusionGeometry, width: int, height: int, rows: int) -> int:
    """One UNet step's activations for `rows` latents (guidance doubles them)."""
    tokens = (width // geometry.scale) * (height // geometry.scale)
    maps = tokens * geometry.unet_channels * UNET_LIVE
    attention = 0
    if geometry.unet_attention_level is not None:
        level_tokens = tokens // 4**geometry.unet_attention_level
        attention = level_tokens * level_tokens * geometry.unet_heads
    return (maps + attention) * geometry.unet_element * rows


def decoding_bytes(geometry: DiffusionGeometry, width: int, height: int, images: int) -> int:
    """The VAE decoder's activations for `images` images of `width`×`height`."""
    maps = width * height * geometry.vae_channels * VAE_LIVE
    tokens = (width // geometry.scale) * (height // geometry.scale)
    return (maps + tokens * tokens) * geometry.vae_element * images


def image_bytes(
    geometry: DiffusionGeometry, width: int, height: int, images: int, guided: bool = True
) -> int:
    """The first quote for `images` images of `width`×`height` made together."""
    rows = images * (2 if guided else 1)
    return max(
        denoising_bytes(geometry, width, height, rows),
        decoding_bytes(geometry, width, height, images),
    )
