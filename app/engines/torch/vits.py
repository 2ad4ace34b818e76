"""VITS (MMS-TTS) inference, several texts in one forward, each row as it would be alone.

transformers' `VitsModel.forward` draws its noise for the whole batch at once (the
stochastic duration predictor's `torch.randn` and the prior's `randn_like`), so a row's
speech depends on what it shares a batch with, and its HiFi-GAN decoder convolves a
padded row's spectrogram past the row's end, where activations of the padding (biases,
not zeros) leak into its last samples. This is that forward with two changes, nothing
else: each row's noise is drawn from its own generator, seeded per request, in the shape
and order `forward` draws it for one row alone; and the decoder zeroes every row past its
own end before each convolution, as a convolution of the row alone sees zero padding
there. The text encoder, the duration predictor's flows and the prior flow are the
model's own modules (they mask their padding already). With a batch of one, the output is
`VitsModel.forward`'s after `torch.manual_seed(seed)` (tests/engines/torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from app.engines.torch.hifigan import decode, frames_mask, hop, widest_stage

# spectrogram frames a token may last at speed 1: MMS-TTS's characters (a blank between
# each two) last 2 to 6 frames; twice that, for a margin
FRAMES_PER_TOKEN = 12
BUFFERS = 6  # the decoder's live activations at its widest: the block's in, out and temps


@dataclass(frozen=True)
class Row:
    """One text to speak: its token ids, speaker, speed and noise seed."""

    ids: list[int]
    speaker: int
    speed: float
    seed: int


def padded_ids(
    rows: list[Row], pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' token ids padded on the right with `pad` to the longest, and the mask of
    their own tokens: (rows, longest) each, on `device`."""
    longest = max(len(row.ids) for row in rows)
    ids = torch.full((len(rows), longest), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row.ids)] = torch.tensor(row.ids)
        mask[i, : len(row.ids)] = 1
    return ids.to(device), mask.to(device)


def synthesize(model: Any, rows: list[Row]) -> list[torch.Tensor]:
    """Each row's waveform (float, the model's sampling rate), in order."""
    config = model.config
    device, dtype = model.device, model.dtype
    ids, mask = padded_ids(rows, 0, device)
    generators = [torch.Generator().manual_seed(row.seed) for row in rows]
    input_mask = mask.unsqueeze(-1).to(model.text_encoder.embed_tokens.weight.dtype)
    speakers = None
    if config.num_speakers > 1:
        chosen = torch.tensor([row.speaker for row in rows], device=device)
        speakers = model.embed_speaker(chosen).unsqueeze(-1)
    encoded = model.text_encoder(input_ids=ids, padding_mask=input_mask, attention_mask=mask)
    hidden = encoded.last_hidden_state.transpose(1, 2)
    input_mask = input_mask.transpose(1, 2)
    lengths = [len(row.ids) for row in rows]
    log_duration = _log_duration(model, hidden, input_mask, speakers, generators, lengths)
    scale = torch.tensor([1.0 / row.speed for row in rows], device=device, dtype=dtype)
    duration = torch.ceil(torch.exp(log_duration) * input_mask * scale.view(-1, 1, 1))
    frames = torch.clamp_min(torch.sum(duration, [1, 2]), 1).long()
    output_mask = frames_mask(frames, input_mask.dtype)
    attn = _alignment(duration, input_mask, output_mask)
    means = torch.matmul(attn, encoded.prior_means).transpose(1, 2)
    log_variances = torch.matmul(attn, encoded.prior_log_variances).transpose(1, 2)
    # `randn_like` of the prior's means, which are (batch, frames, channels) transposed:
    # it fills a tensor of their strides, element by element (not contiguous, so not
    # torch's vectorised fill): drawn so here too
    noise = _noise(generators, means.shape[1], frames.tolist(), device, dtype, transposed=True)
    latents = means + noise * torch.exp(log_variances) * model.noise_scale
    latents = model.flow(latents, output_mask, speakers, reverse=True)
    waveform = decode(model.decoder, latents * output_mask, output_mask, speakers)
    samples = hop(config)
    return [waveform[i, : int(n) * samples] for i, n in enumerate(frames.tolist())]


def activation_bytes(config: Any, tokens: int, batch: int) -> int:
    """An upper bound on one forward's activations over `batch` rows of `tokens` tokens
    (at speed 1): the HiFi-GAN decoder at its widest stage dominates; the text encoder's
    attention over the tokens beside it."""
    frames = tokens * FRAMES_PER_TOKEN
    attention = int(config.num_attention_heads) * tokens * tokens
    flow = 4 * int(config.hidden_size) * frames
    return batch * 4 * (BUFFERS * widest_stage(config, frames) + attention + flow)


def _noise(
    generators: list[torch.Generator],
    channels: int,
    lengths: list[int],
    device: torch.device,
    dtype: torch.dtype,
    *,
    transposed: bool = False,
) -> torch.Tensor:
    """Each row's standard normal noise of (channels, its own length), drawn from its own
    generator on the CPU (`transposed`: into a (length, channels) tensor's transpose, as
    `randn_like` fills one), zero past its end."""
    out = torch.zeros((len(lengths), channels, max(lengths)), dtype=dtype)
    for i, (generator, length) in enumerate(zip(generators, lengths, strict=True)):
        if transposed:
            drawn = torch.empty((length, channels), dtype=torch.float32).T
            out[i, :, :length] = drawn.normal_(generator=generator)
        else:
            out[i, :, :length] = torch.randn((channels, length), generator=generator)
    return out.to(device)


def _log_duration(
    model: Any,
    hidden: torch.Tensor,
    mask: torch.Tensor,
    speakers: torch.Tensor | None,
    generators: list[torch.Generator],
    lengths: list[int],
) -> torch.Tensor:
    """The duration predictor's reverse pass (the stochastic one with each row's noise)."""
    predictor = model.duration_predictor
    if not model.config.use_stochastic_duration_prediction:
        return predictor(hidden, mask, speakers)  # type: ignore[no-any-return]
    inputs = predictor.conv_pre(hidden)
    if speakers is not None:
        inputs = inputs + predictor.cond(speakers)
    inputs = predictor.conv_dds(inputs, mask)
    inputs = predictor.conv_proj(inputs) * mask
    flows = list(reversed(predictor.flows))
    flows = [*flows[:-2], flows[-1]]  # as transformers: the unused affine flow left out
    noise = _noise(generators, 2, lengths, hidden.device, hidden.dtype)
    latents = noise * model.noise_scale_duration
    for flow in flows:
        latents = torch.flip(latents, [1])
        latents, _ = flow(latents, mask, global_conditioning=inputs, reverse=True)
    return latents[:, :1]


def _alignment(
    duration: torch.Tensor, input_mask: torch.Tensor, output_mask: torch.Tensor
) -> torch.Tensor:
    """Which input token each output frame repeats (batch, frames, tokens), as
    transformers builds it from the durations."""
    attn_mask = torch.unsqueeze(input_mask, 2) * torch.unsqueeze(output_mask, -1)
    batch, _, frames, tokens = attn_mask.shape
    cumulative = torch.cumsum(duration, -1).view(batch * tokens, 1)
    indices = torch.arange(frames, dtype=duration.dtype, device=duration.device)
    valid = (indices.unsqueeze(0) < cumulative).to(attn_mask.dtype).view(batch, tokens, frames)
    starts = valid - nn.functional.pad(valid, [0, 0, 1, 0, 0, 0])[:, :-1]
    return (starts.unsqueeze(1).transpose(2, 3) * attn_mask).squeeze(1)
