"""SpeechT5 text to speech (`SpeechT5ForTextToSpeech` and its `SpeechT5HifiGan` vocoder),
several texts in one decoding loop, each row as it would be alone.

transformers' `generate_speech` decodes a batch in one loop, but a row's speech depends
on what it shares the batch with in three ways: the decoder prenet keeps its dropout on
at inference (SpeechT5's paper, after Tacotron 2) and draws one mask from the global
generator for the whole batch; every row decodes until the padded length's limit
(`maxlenratio` times the longest text), not its own; and the vocoder convolves a padded
row's spectrogram past the row's end. This is that loop with those three changed,
nothing else: each row's masks come from its own generator, seeded per request, in the
shape and order `generate_speech` draws them for one row alone; each row stops at its
own threshold or its own limit; and the vocoder zeroes every row past its end before each
convolution (app.engines.torch.hifigan). The encoder, decoder layers and postnet are the
model's own modules. With a batch of one at speed 1 the waveform is `generate_speech`'s
after `torch.manual_seed(seed)` (tests/engines/torch/test_speecht5.py).

SpeechT5 has no duration control: a speed other than 1 stretches the row's spectrogram
along time (linear interpolation of its frames) before the vocoder, which changes the
length and keeps the pitch.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch import nn

from app.engines.torch.hifigan import decode, frames_mask, hop, widest_stage
from app.engines.torch.vits import Row, padded_ids

THRESHOLD = 0.5  # generate_speech's defaults: a stop probability, and frames per token
MAX_LENGTH_RATIO = 20.0
BUFFERS = 6  # the vocoder's live activations at its widest, as VITS's (app.engines.torch.vits)


def synthesize(
    model: Any, vocoder: Any, rows: list[Row], voices: torch.Tensor
) -> list[torch.Tensor]:
    """Each row's waveform (float, 16 kHz), in order; `voices` holds one speaker
    embedding (x-vector) per speaker id."""
    config = model.config
    device = model.device
    ids, mask = padded_ids(rows, int(config.pad_token_id), device)
    speakers = voices[[row.speaker for row in rows]].to(device, model.dtype)
    generators = [torch.Generator().manual_seed(row.seed) for row in rows]
    encoded = model.speecht5.encoder(input_values=ids, attention_mask=mask, return_dict=True)
    spectrograms = _decode_steps(model, encoded.last_hidden_state, mask, speakers, generators)
    spectrograms = [_stretched(s, row.speed) for s, row in zip(spectrograms, rows, strict=True)]
    return _vocoded(vocoder, spectrograms)


def _decode_steps(
    model: Any,
    encoded: torch.Tensor,
    mask: torch.Tensor,
    speakers: torch.Tensor,
    generators: list[torch.Generator],
) -> list[torch.Tensor]:
    """generate_speech's loop: each row's spectrogram (frames, mel bins) after the
    postnet, the row stopped at its own threshold or limit."""
    config = model.config
    decoder, postnet = model.speecht5.decoder, model.speech_decoder_postnet
    rows, reduction, bins = encoded.size(0), int(config.reduction_factor), int(config.num_mel_bins)
    limits = [int(int(n) * MAX_LENGTH_RATIO / reduction) for n in mask.sum(1).tolist()]
    sequence = encoded.new_zeros(rows, 1, bins)
    steps: list[torch.Tensor] = []
    done: dict[int, torch.Tensor] = {}
    cache: Any = None
    by_name = _cache_argument(decoder.wrapped_decoder)
    step = 0
    while len(done) < rows:
        step += 1
        hidden = _prenet(decoder.prenet, sequence, speakers, generators)
        out = decoder.wrapped_decoder(
            hidden_states=hidden[:, -1:],
            attention_mask=None,
            encoder_hidden_states=encoded,
            encoder_attention_mask=mask,
            use_cache=True,
            return_dict=True,
            **{by_name: cache},
        )
        last = out.last_hidden_state.squeeze(1)
        cache = out.cache if "cache" in out else out.past_key_values
        spectrum = postnet.feat_out(last).view(rows, reduction, bins)
        steps.append(spectrum)
        sequence = torch.cat((sequence, spectrum[:, -1:, :]), dim=1)
        stops = (torch.sigmoid(postnet.prob_out(last)).sum(-1) >= THRESHOLD).tolist()
        ending = [i for i in range(rows) if i not in done and (step >= limits[i] or stops[i])]
        if ending:
            so_far = torch.stack(steps).transpose(0, 1).flatten(1, 2)
            for i in ending:  # the postnet's convolutions over the row alone
                done[i] = postnet.postnet(so_far[i : i + 1])[0]
    return [done[i] for i in range(rows)]


def _cache_argument(decoder: Any) -> str:
    """The decoder's argument for its key-value cache: `cache` in later transformers 5
    releases, `past_key_values` in the first ones (5.0); its output names it likewise."""
    names = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in names else "past_key_values"


def _prenet(
    prenet: Any, sequence: torch.Tensor, speakers: torch.Tensor, generators: list[torch.Generator]
) -> torch.Tensor:
    """SpeechT5SpeechDecoderPrenet's forward with each row's dropout mask from its own
    generator (on the CPU, in the shape its `_consistent_dropout` draws for row 0)."""
    p = float(prenet.config.speech_decoder_prenet_dropout)
    hidden = sequence
    for layer in prenet.layers:
        hidden = nn.functional.relu(layer(hidden))
        drawn = torch.empty(tuple(hidden.shape[1:]), dtype=hidden.dtype)
        masks = torch.stack([torch.bernoulli(drawn, p, generator=g) for g in generators])
        masks = masks.to(hidden.device)
        hidden = torch.where(masks == 1, hidden, 0) * 1 / (1 - p)
    hidden = prenet.encode_positions(prenet.final_layer(hidden))
    voice = nn.functional.normalize(speakers).unsqueeze(1).expand(-1, hidden.size(1), -1)
    return nn.functional.relu(prenet.speaker_embeds_layer(torch.cat([hidden, voice], dim=-1)))


def _stretched(spectrogram: torch.Tensor, speed: float) -> torch.Tensor:
    """The spectrogram played at `speed`: its frames resampled along time (1: as it is)."""
    if speed == 1.0:
        return spectrogram
    frames = max(1, round(spectrogram.size(0) / speed))
    resampled = nn.functional.interpolate(
        spectrogram.T.unsqueeze(0), size=frames, mode="linear", align_corners=False
    )
    return resampled[0].T


def _vocoded(vocoder: Any, spectrograms: list[torch.Tensor]) -> list[torch.Tensor]:
    """SpeechT5HifiGan's forward over the rows padded together, each row zeroed past its
    end before each convolution: each row's waveform."""
    config = vocoder.config
    frames = [s.size(0) for s in spectrograms]
    batch = nn.utils.rnn.pad_sequence(spectrograms, batch_first=True)
    if config.normalize_before:
        batch = (batch - vocoder.mean) / vocoder.scale
    mask = frames_mask(torch.tensor(frames, device=batch.device), batch.dtype)
    waveform = decode(vocoder, batch.transpose(1, 2) * mask, mask, None)
    samples = hop(config)
    return [waveform[i, : n * samples] for i, n in enumerate(frames)]


def activation_bytes(config: Any, vocoder_config: Any, tokens: int, batch: int) -> int:
    """An upper bound on one run's memory over `batch` rows of `tokens` tokens: the
    vocoder at its widest stage over the most frames a text may decode to
    (`MAX_LENGTH_RATIO` per token), beside the decoder's key-value cache and the prenet
    over the whole sequence, and the encoder's attention."""
    frames = math.ceil(tokens * MAX_LENGTH_RATIO)
    steps = frames // int(config.reduction_factor) + 1
    hidden = int(config.hidden_size)
    cache = 4 * int(config.decoder_layers) * hidden * steps  # self and cross, keys and values
    prenet = 2 * int(config.speech_decoder_prenet_units) * steps
    attention = int(config.encoder_attention_heads) * tokens * tokens
    vocoder = BUFFERS * widest_stage(vocoder_config, frames)
    return batch * 4 * (vocoder + cache + prenet + attention)
