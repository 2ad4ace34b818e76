"""A diffusion pipeline's first quote for an image size, from its own configs, before any
run has been measured. Pure: the numbers come from the UNet's and the VAE's config.json.

A text-to-image run has two phases that never hold memory at the same time:

- **denoising**: the UNet runs on the latents (1/`scale` of the image a side), twice
  over the batch with classifier-free guidance. Counted as `UNET_LIVE` feature maps of
  its first level's channels at the latents' size: the skip connections every level
  keeps for the way up (about 5.5 such maps in SD's layout: 3 a level, each level a
  quarter of the pixels at twice the channels) and the working set of a resnet or
  transformer block (about 6 more).
- **decoding**: the VAE decoder upsamples the latents to full resolution; at every
  pixel it holds the last upsampler's maps (interpolated and convolved, `vae[1]`
  channels: twice `vae[0]` in SD's VAE, 4 maps' worth) and its last level's resnets
  (input, two norms, two convolutions and the residual at `vae[0]` channels): counted
  as `VAE_LIVE` maps of `vae[0]` channels. This phase dominates at every size: at
  1024² SD 1.5's decoder holds 128 channels at each of a million pixels, its UNet 320
  at each of 16,384 latent pixels.

Attention is not counted as tokens²: diffusers runs it through PyTorch's
scaled_dot_product_attention, whose flash and memory-efficient kernels hold a few
feature maps (within the counts above), not the attention matrix.

A **tiled** decode (the VAE's own `tiled_decode`, chosen by the server when only it fits)
runs the decoder on one tile at a time (`vae_tile`² pixels, the VAE's `sample_size`: 512
for SD 1.5, 1024 for SDXL) and keeps, 3 channels each, every decoded tile (1.6-1.7 times
the image, for their overlaps), the blended rows, the joined image and a copy for
post-processing: counted as a tile's decode plus `TILED_KEPT` images.

Quote = max(denoising, decoding): SD 1.5 in float16 0.75 GiB at 512², 3 GiB at 1024²;
SDXL (float32 decoder) 1.5 and 6 GiB. The constants err above (the design's measured
SDXL peaks grow by about 3.1 GB from 512² to 1024², this quote by 4.5 GiB); every run
then teaches the bucket its measured peak, which replaces the quote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

UNET_LIVE = 12  # first-level feature maps alive at once in a UNet step (skips + working)
VAE_LIVE = 12  # full-resolution maps of vae[0] channels alive at once in the VAE decoder
TILED_KEPT = 5  # images' worth (3 channels) a tiled decode keeps beside its tile


@dataclass(frozen=True)
class DiffusionGeometry:
    """What the quote needs of a pipeline: channels, the VAE's scale, element sizes."""

    scale: int  # image pixels per latent pixel, a side (the VAE's downsampling)
    unet_channels: int  # the UNet's first level
    vae_channels: int  # the VAE decoder's last (full-resolution) level
    unet_element: int  # bytes per element
    vae_element: int
    vae_tile: int = 512  # a tiled decode's tile side in pixels (the VAE's sample_size)

    @staticmethod
    def from_configs(
        unet: dict[str, Any], vae: dict[str, Any], scale: int, element: int, vae_upcast: bool
    ) -> DiffusionGeometry:
        """From the UNet's and VAE's configs; `vae_upcast`: the VAE decodes in float32
        whatever the pipeline's dtype (SDXL's `force_upcast`)."""
        return DiffusionGeometry(
            scale=scale,
            unet_channels=int((unet.get("block_out_channels") or [320])[0]),
            vae_channels=int((vae.get("block_out_channels") or [128])[0]),
            unet_element=element,
            vae_element=4 if vae_upcast else element,
            vae_tile=int(vae.get("sample_size") or 512),
        )


def denoising_bytes(geometry: DiffusionGeometry, width: int, height: int, rows: int) -> int:
    """One UNet step's activations for `rows` latents (guidance doubles them)."""
    tokens = (width // geometry.scale) * (height // geometry.scale)
    return tokens * geometry.unet_channels * UNET_LIVE * geometry.unet_element * rows


def decoding_bytes(geometry: DiffusionGeometry, width: int, height: int, images: int) -> int:
    """The VAE decoder's activations for `images` images of `width`×`height`."""
    return width * height * geometry.vae_channels * VAE_LIVE * geometry.vae_element * images


def tiled_decoding_bytes(geometry: DiffusionGeometry, width: int, height: int, images: int) -> int:
    """The VAE decoder's activations for one tile of every image, and the decoded tiles,
    rows and image kept beside them (`TILED_KEPT` images of 3 channels)."""
    tile = decoding_bytes(
        geometry, min(width, geometry.vae_tile), min(height, geometry.vae_tile), images
    )
    return tile + width * height * 3 * TILED_KEPT * geometry.vae_element * images


def image_bytes(
    geometry: DiffusionGeometry,
    width: int,
    height: int,
    images: int,
    guided: bool = True,
    tiled: bool = False,
) -> int:
    """The first quote for `images` images of `width`×`height` made together (`tiled`:
    their VAE decode run in tiles)."""
    rows = images * (2 if guided else 1)
    decode = tiled_decoding_bytes if tiled else decoding_bytes
    return max(
        denoising_bytes(geometry, width, height, rows),
        decode(geometry, width, height, images),
    )
