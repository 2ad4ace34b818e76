"""A tiny random Whisper, and audio files, built on the spot for the speech tests.

The tokenizer is a byte-level BPE trained here on a few lines, with Whisper's special
tokens (<|startoftranscript|>, languages, tasks, <|notimestamps|>) and its 1,501
timestamp tokens after them, as the real vocabularies have them: `generate` with
`return_timestamps=True` and the tokenizer's offsets work as they do on a real Whisper.
"""

from __future__ import annotations

import math
import random
import wave
from pathlib import Path

import numpy as np

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "speech to text turns sound into words",
    "a local server admits work by measured bytes",
    "hello world, one two three, testing testing",
]
LANGUAGES = ("en", "fr", "de", "es")
SAMPLE_RATE = 16_000


def _whisper_tokenizer(folder: Path) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import WhisperTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(CORPUS, trainer)
    specials = [
        "<|endoftext|>",
        "<|startoftranscript|>",
        *(f"<|{code}|>" for code in LANGUAGES),
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nocaptions|>",
        "<|notimestamps|>",
    ]
    timestamps = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    tokenizer = WhisperTokenizerFast(
        tokenizer_object=bpe,
        unk_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    tokenizer.add_tokens(timestamps)
    tokenizer.save_pretrained(folder)
    return tokenizer


def save_random_whisper(
    folder: Path, *, d_model: int = 32, layers: int = 2, init_std: float = 0.2
) -> Path:
    """A WhisperForConditionalGeneration with random weights, its processor (feature
    extractor + tokenizer) and a generation config that knows its special tokens, saved
    with `save_pretrained`. The end-of-text row of the output layer is lowered so that
    greedy decoding writes a few segments rather than ending at once."""
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
    )

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _whisper_tokenizer(folder)
    ids = tokenizer.convert_tokens_to_ids  # type: ignore[attr-defined]
    eot = ids("<|endoftext|>")
    config = WhisperConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        num_mel_bins=80,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        max_source_positions=1500,
        max_target_positions=448,
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=ids("<|startoftranscript|>"),
        begin_suppress_tokens=[220, eot],
        suppress_tokens=[],
        init_std=init_std,
    )
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config)
    with torch.no_grad():
        model.proj_out.weight[eot].mul_(0.0)
    generation = GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id,
        eos_token_id=eot,
        pad_token_id=eot,
        bos_token_id=eot,
        max_length=448,
        begin_suppress_tokens=[eot],
        suppress_tokens=[],
        no_timestamps_token_id=ids("<|notimestamps|>"),
        prev_sot_token_id=ids("<|startofprev|>"),
        is_multilingual=True,
        lang_to_id={f"<|{code}|>": ids(f"<|{code}|>") for code in LANGUAGES},
        task_to_id={"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")},
        max_initial_timestamp_index=50,
        alignment_heads=[[layers - 1, 0]],
    )
    model.generation_config = generation
    model.save_pretrained(folder)
    processor = WhisperProcessor(WhisperFeatureExtractor(feature_size=80), tokenizer)
    processor.save_pretrained(folder)
    return folder


def save_scripted_whisper(folder: Path, script: list[str]) -> Path:
    """A Whisper (saved and loaded like any) whose greedy decoding writes `script`, one
    token a step, whatever the audio: `save_random_whisper`'s, with its decoder layers'
    outputs zeroed (each layer passes its input on), token embeddings zeroed, and each
    position's embedding a one-hot that only the scripted token's (untied) output row
    reads. Its decoder prompt is three tokens (start, language, task), so step i reads
    position 2 + i. `script` holds tokens as the tokenizer spells them ("<|0.00|>",
    "<|en|>", or a text piece such as `text_tokens` gives)."""
    import torch
    from transformers import AutoTokenizer, WhisperForConditionalGeneration

    save_random_whisper(folder)
    model = WhisperForConditionalGeneration.from_pretrained(folder)
    ids = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids(script)
    decoder = model.model.decoder
    model.config.tie_word_embeddings = False
    with torch.no_grad():
        model.proj_out.weight = torch.nn.Parameter(torch.zeros_like(model.proj_out.weight))
        decoder.embed_tokens.weight.zero_()
        decoder.embed_positions.weight.zero_()
        for layer in decoder.layers:
            for out in (layer.self_attn.out_proj, layer.encoder_attn.out_proj, layer.fc2):
                out.weight.zero_()
                if out.bias is not None:
                    out.bias.zero_()
        slots: dict[int, int] = {}
        for step, token in enumerate(ids):
            slot = slots.setdefault(token, len(slots))
            decoder.embed_positions.weight[2 + step, slot] = 1.0
            model.proj_out.weight[token, slot] = 10.0
    model.save_pretrained(folder)
    return folder


def text_tokens(folder: Path, text: str) -> list[str]:
    """`text` as the tokens of the tokenizer saved in `folder`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer.convert_ids_to_tokens(tokenizer.encode(text, add_special_tokens=False))


def tone(seconds: float, *, seed: int = 0) -> np.ndarray:
    """16 kHz mono float32: a tone whose pitch (drawn from `seed`) changes each second,
    with some noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE), dtype=np.float64) / SAMPLE_RATE
    pitch = rng.uniform(150, 900, size=math.ceil(seconds) + 1)[np.floor(t).astype(int)]
    samples = 0.4 * np.sin(2 * math.pi * pitch * t) + 0.05 * rng.standard_normal(t.size)
    return samples.astype(np.float32)


def write_wav(path: Path, samples: np.ndarray, rate: int = SAMPLE_RATE) -> Path:
    """16-bit PCM mono with the stdlib's `wave`."""
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return path


CODECS = {"flac": "flac", "mp3": "libmp3lame", "ogg": "libopus", "webm": "libopus", "m4a": "aac"}


def write_encoded(path: Path, samples: np.ndarray, rate: int = SAMPLE_RATE) -> Path:
    """`samples` encoded by PyAV in the container and codec `path`'s suffix names."""
    import av

    codec = CODECS[path.suffix.lstrip(".")]
    out_rate = 48_000 if codec == "libopus" else rate
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=out_rate)
        stream.layout = "mono"  # type: ignore[union-attr]
        frame = av.AudioFrame.from_ndarray(
            samples.reshape(1, -1).astype(np.float32), format="flt", layout="mono"
        )
        frame.sample_rate = rate
        resampler = av.AudioResampler(
            format=stream.format.name,  # type: ignore[union-attr]
            layout="mono",
            rate=out_rate,
        )
        for piece in resampler.resample(frame):
            for packet in stream.encode(piece):  # type: ignore[union-attr]
                container.mux(packet)
        for packet in stream.encode(None):  # type: ignore[union-attr]
            container.mux(packet)
    return path


def not_audio(path: Path) -> Path:
    """A small PDF: what a caller may send by mistake."""
    body = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
    path.write_bytes(body + bytes(random.Random(0).randbytes(256)))
    return path
