"""A tiny random VITS (MMS-TTS's architecture), built on the spot for the text-to-speech
tests: `VitsModel` with random weights and its `VitsTokenizer` (a character vocabulary,
as MMS-TTS's English one: lower-case letters, space, apostrophe and hyphen; no
phonemizer), saved with `save_pretrained`. A duration predictor biased up, so that each
character lasts a few frames and a sentence is audio of a second or so, as a real
model's."""

from __future__ import annotations

import json
from pathlib import Path

CHARACTERS = list("_ abcdefghijklmnopqrstuvwxyz'-")  # "_" first: id 0, the blank


def save_random_vits(
    folder: Path, *, speakers: int = 1, hidden: int = 16, mms_size: bool = False
) -> Path:
    """A VitsModel (`speakers` > 1: with a speaker embedding) and its tokenizer; tiny, or
    (`mms_size`) at MMS-TTS's own size (VitsConfig's defaults are facebook/mms-tts-eng's:
    hidden 192, 6 text-encoder layers, a 512-channel HiFi-GAN decoder), for the
    benchmarks."""
    import torch
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.json"
    vocab.write_text(json.dumps({c: i for i, c in enumerate(CHARACTERS)}), encoding="utf-8")
    tokenizer = VitsTokenizer(
        str(vocab), pad_token="_", unk_token="_", add_blank=True, normalize=True, phonemize=False
    )
    tokenizer.save_pretrained(folder)
    small = dict(
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        ffn_dim=2 * hidden,
        flow_size=hidden,
        spectrogram_bins=hidden + 1,
        upsample_initial_channel=32,
        upsample_rates=[8, 8, 2, 2],
        upsample_kernel_sizes=[16, 16, 4, 4],
        resblock_kernel_sizes=[3, 7],
        resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]],
        duration_predictor_filter_channels=hidden,
        duration_predictor_num_flows=2,
        prior_encoder_num_flows=2,
        prior_encoder_num_wavenet_layers=2,
        posterior_encoder_num_wavenet_layers=2,
    )
    config = VitsConfig(
        vocab_size=len(CHARACTERS),
        **({} if mms_size else small),
        num_speakers=speakers,
        speaker_embedding_size=(256 if mms_size else 8) if speakers > 1 else 0,
        sampling_rate=16_000,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = VitsModel(config).eval()
    # each token about four frames long (the predictor runs this flow in reverse: its
    # translation of 1 shifts the log durations of a random model into a speech's range)
    with torch.no_grad():
        model.duration_predictor.flows[0].translate.fill_(1.0)
    model.save_pretrained(folder)
    return folder
