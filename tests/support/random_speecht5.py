"""A tiny random SpeechT5 text-to-speech model, built on the spot: `SpeechT5ForTextToSpeech`
with random weights, its `SpeechT5Tokenizer` over a character-level SentencePiece model
trained here (as Microsoft's speecht5_tts: one piece per character), a random
`SpeechT5HifiGan` in its `vocoder` folder, and (`speakers` > 1) a `speakers.safetensors`
of random speaker embeddings; all saved with the real save code.

A random model's stop probability hardly changes from step to step, so it stops after one
step (two frames) or never. Its stop layer is set so that it never stops and every row
runs to its own length limit, ten steps of two frames a token (`stops="never"`), or
(`"early"`) calibrated on one text decoded by transformers' `generate_speech`: it reads
the decoder's output along the way that output drifted, and fires where the reading
passes its 90th percentile on that text. Then a long text stops on its threshold (the
tests' longest after 291 of its 480 steps) and short ones run to their limits, so a batch
of both has rows ending either way. The random vocoder's output (1e-8) is scaled to
speech's loudness (0.3 at most on that text)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

# what the SentencePiece model learns its characters from: lower and upper case, digits
# and punctuation, as the texts the tests speak
CORPUS = [
    "the quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!",
    "hello world, this is speech? 0 1 2 3 4 5 6 7 8 9; it's a-ok: yes.",
]
MEL_BINS = 20
SPEAKER_WIDTH = 16


def save_random_speecht5(
    folder: Path, *, speakers: int = 1, stops: Literal["early", "never"] = "early"
) -> Path:
    import sentencepiece
    import torch
    from safetensors.torch import save_file
    from transformers import (
        SpeechT5Config,
        SpeechT5ForTextToSpeech,
        SpeechT5HifiGan,
        SpeechT5HifiGanConfig,
        SpeechT5Tokenizer,
    )

    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 20), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(folder / "spm_char"),
        model_type="char",
        vocab_size=60,
        bos_id=0,
        pad_id=1,
        eos_id=2,
        unk_id=3,
        character_coverage=1.0,
        minloglevel=2,
    )
    corpus.unlink()
    tokenizer = SpeechT5Tokenizer(str(folder / "spm_char.model"))
    tokenizer.save_pretrained(folder)
    config = SpeechT5Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        speech_decoder_prenet_units=32,
        speech_decoder_postnet_units=32,
        speaker_embedding_dim=SPEAKER_WIDTH,
        num_mel_bins=MEL_BINS,
        max_text_positions=600,
        max_speech_positions=4000,
    )
    torch.manual_seed(0)
    model = SpeechT5ForTextToSpeech(config).eval()
    vocoder_config = SpeechT5HifiGanConfig(
        model_in_dim=MEL_BINS,
        upsample_initial_channel=32,
        upsample_rates=[4, 4, 4, 4],
        upsample_kernel_sizes=[8, 8, 8, 8],
        resblock_kernel_sizes=[3, 7],
        resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]],
    )
    vocoder = SpeechT5HifiGan(vocoder_config).eval()
    stop = model.speech_decoder_postnet.prob_out
    with torch.no_grad():
        stop.weight.zero_()
        stop.bias.fill_(-20.0)
        seen: list[torch.Tensor] = []
        hook = stop.register_forward_hook(lambda _m, given, _o: seen.append(given[0][0]))
        ids = tokenizer(CORPUS[2], return_tensors="pt").input_ids
        torch.manual_seed(0)
        spectrogram = model.generate_speech(ids, torch.zeros((1, SPEAKER_WIDTH)))
        hook.remove()
        if stops == "early":
            outputs = torch.stack(seen)
            drift = outputs[-1] - outputs[0]
            reading = outputs @ drift
            stop.weight.copy_(drift.expand_as(stop.weight))
            stop.bias.fill_(-float(torch.quantile(reading, 0.9)))
        vocoder.conv_post.weight.mul_(0.3 / float(vocoder(spectrogram).abs().max()))
    model.save_pretrained(folder)
    vocoder.save_pretrained(folder / "vocoder")
    if speakers > 1:
        voices = torch.randn((speakers, SPEAKER_WIDTH), generator=torch.Generator().manual_seed(1))
        save_file({"speakers": voices}, str(folder / "speakers.safetensors"))
    return folder
