"""HiFi-GAN vocoders (VITS's decoder, SpeechT5's vocoder) over a batch of spectrograms
of several lengths, each row as it would be alone: a convolution of a row alone sees zero
padding past its end, but in a padded batch it sees the padding's activations (biases,
not zeros), which leak into the row's last samples; so every row is zeroed past its own
end before each convolution."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def widest_stage(config: Any, frames: int) -> int:
    """The elements of a HiFi-GAN's widest activation (channels × upsampled frames) over
    `frames` spectrogram frames: its memory's largest term."""
    widest, length, channels = 0, frames, int(config.upsample_initial_channel)
    for rate in config.upsample_rates:
        length, channels = length * int(rate), channels // 2
        widest = max(widest, channels * length)
    return widest


def frames_mask(frames: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(rows, 1, longest): 1 within each row's `frames`, 0 past its end."""
    indices = torch.arange(int(frames.max()), dtype=frames.dtype, device=frames.device)
    return (indices.unsqueeze(0) < frames.unsqueeze(1)).unsqueeze(1).to(dtype)


def hop(config: Any) -> int:
    """Samples per spectrogram frame: the product of the upsampling rates."""
    return int(torch.prod(torch.tensor(config.upsample_rates)))


def decode(
    decoder: Any, spectrogram: torch.Tensor, mask: torch.Tensor, speakers: torch.Tensor | None
) -> torch.Tensor:
    """VitsHifiGan's forward with every row zeroed past its end before each convolution
    (its mask upsampled with it): (batch, samples)."""
    slope = decoder.config.leaky_relu_slope
    hidden = decoder.conv_pre(spectrogram)
    if speakers is not None:
        hidden = hidden + decoder.cond(speakers)
    for i, (upsampler, rate) in enumerate(
        zip(decoder.upsampler, decoder.config.upsample_rates, strict=True)
    ):
        hidden = upsampler(nn.functional.leaky_relu(hidden, slope) * mask)
        mask = torch.repeat_interleave(mask, int(rate), dim=2)
        blocks = decoder.resblocks[i * decoder.num_kernels : (i + 1) * decoder.num_kernels]
        hidden = sum(_residual(block, hidden, mask) for block in blocks) / decoder.num_kernels
    hidden = decoder.conv_post(nn.functional.leaky_relu(hidden) * mask)
    return torch.tanh(hidden).squeeze(1)


def _residual(block: Any, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """HifiGanResidualBlock's forward, masked before each convolution."""
    slope = block.leaky_relu_slope
    for conv1, conv2 in zip(block.convs1, block.convs2, strict=True):
        residual = hidden
        hidden = conv1(nn.functional.leaky_relu(hidden, slope) * mask)
        hidden = conv2(nn.functional.leaky_relu(hidden, slope) * mask)
        hidden = hidden + residual
    return hidden
