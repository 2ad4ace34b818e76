"""Speech to text: a Whisper folder (WhisperForConditionalGeneration and its processor)
through transformers, safetensors only.

A clip is decoded and cut into 30-second windows on the CPU pool (app.models.audio);
each window is a row. Windows of one or several requests run together, `max_batch`
windows to a `generate` call, each decoded on its own with Whisper's timestamp tokens
(`return_timestamps=True`), one sequence a window (`num_beams=1`, whatever the model's
generation config names): greedy at temperature 0, sampled above it. Greedy, a window
gets the tokens transformers' pipeline gives for it (chunk_length_s=30, no stride) when
the pipeline is asked for greedy decoding (`generate_kwargs={"num_beams": 1}`). Left to
its defaults the pipeline searches 5 beams wherever the model's generation config names
no `num_beams` (its `_default_generation_config`), and beam search may choose otherwise
from the first token on: on the random Whisper of tests/support it starts at <|0.54|>,
the second most likely first token, where greedy takes the first, <|0.28|> (logits 2.21
and 2.34). The prompt, the features, the suppressed tokens and the timestamp rules are
the same on both paths (the pipeline's attention mask changes no token: Whisper's
encoder reads none). The server stays greedy: temperature 0 means the most likely token
at each step (temperature > 0 samples one sequence), and a window's memory quote
(`speech_bytes`) and its decoding time count one sequence, which 5 beams would make five
(decoder caches, encoder states repeated for each beam). Segments are the tokenizer's
offsets, placed in the clip and kept within its audio. Word timestamps, where asked for,
are the pipeline's `return_timestamps="word"`: each token's time from the
cross-attention of the config's `alignment_heads` (dynamic time warping), cut into words
by the tokenizer, within the audio too.

Bucket: `w30xbN`, N the windows in one `generate` call rounded up to a power of two
(capped at `max_batch`: a longer clip runs in calls of that many, so its memory is that
of one call); `w30xbN~words` for windows timed word by word, a variant of its own (see
app.models.image_buckets): transformers then generates with `output_attentions` and
`output_scores` in eager attention, holding every layer's encoder attention maps, the
decoder's cross-attentions and each step's scores, several times a plain window's bytes,
so a plain price never quotes it. The first quote comes from the model's config
(`speech_bytes`, plus `word_bytes` a window for words); every run then teaches the bucket
its measured peak.

transformers switches the model's config to eager attention for word timestamps and
leaves it so: every `generate` holds the handler's lock, and a word run restores the
setting it found, so no run (plain or word) sees another's attention setting.
"""

from __future__ import annotations

import gc
import io
import re
import threading
import time
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.config.settings import ModelSpec
from app.devices.base import Device
from app.devices.torch_backed import torch_device_of
from app.engines.torch.module import TorchModule
from app.errors import InvalidRequest
from app.models.audio import (
    SAMPLE_RATE,
    WINDOW_S,
    AudioClip,
    SpeechOptions,
    Window,
    decode_audio,
    windows,
)
from app.models.base import dtype_on, weight_file_bytes
from app.models.kinds import Transcriber
from app.models.prepared import Bucket, Prepared, next_pow2
from app.models.stages import InThreads
from app.models.transcript import Segment, WindowText, placed

WORDS = "words"  # the bucket variant of windows timed word by word
LABEL = re.compile(rf"^w30xb(\d+)(~{WORDS})?$")
MAX_TARGET_TOKENS = 448  # Whisper's decoder positions: a window's tokens at most


def word_bytes(config: Any, element: int) -> int:
    """What timing words adds to one window: transformers generates with
    `output_attentions` and `output_scores` (eager attention), so it holds every encoder
    layer's attention maps over the 1,500 frames, every decoder layer's cross-attention
    of each target token to them, and each step's float32 scores over the vocabulary."""
    frames = int(config.max_source_positions)
    tokens = int(config.max_target_positions)
    encoder = int(config.encoder_layers) * int(config.encoder_attention_heads) * frames * frames
    cross = int(config.decoder_layers) * int(config.decoder_attention_heads) * frames * tokens
    scores = tokens * int(config.vocab_size) * 4
    return element * (encoder + cross) + scores


def speech_bytes(config: Any, batch: int, element: int, words: bool = False) -> int:
    """An upper bound on one `generate` call's activations over `batch` windows: the
    encoder's widest moment (its feed-forward over 1,500 frames, and one layer's
    attention scores counted as if materialised) beside every layer's cross-attention
    keys and values and a full self-attention cache, and `word_bytes` for words, with a
    quarter's margin."""
    frames = int(config.max_source_positions)
    width, heads = int(config.d_model), int(config.encoder_attention_heads)
    layers = int(config.decoder_layers)
    features = 2 * int(config.num_mel_bins) * frames * 4  # float32 mel frames
    encoder = frames * (4 * width + int(config.encoder_ffn_dim)) + heads * frames * frames
    cache = 2 * layers * width * (frames + MAX_TARGET_TOKENS)
    logits = MAX_TARGET_TOKENS * int(config.vocab_size) // 8  # scores of recent steps
    per_window = features + element * (encoder + cache + logits)
    if words:
        per_window += word_bytes(config, element)
    return batch * per_window * 5 // 4


class SpeechHandler(InThreads, TorchModule, Transcriber):
    kind = "speech"
    preprocess_on_loop = False  # decoding audio is never short enough for the loop
    postprocess_on_loop = False  # each window's tokens decoded to timed text

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        assert spec.path is not None, "ModelSpec checks that a speech model has a path"
        self.path = Path(spec.path)
        self._model: Any = None
        self._processor: Any = None
        self._device = torch.device("cpu")
        self._torch_dtype = torch.float32
        self.generate_calls = 0  # generate calls (window batches) since the warm-up
        # every `generate`: a word run sets the shared config's attention to eager
        self._generate_lock = threading.Lock()

    def expected_weights_bytes(self, device: Device) -> int:
        element = torch.finfo(getattr(torch, dtype_on(device, self.spec.dtype))).bits // 8
        return weight_file_bytes(self.path, element)

    def load(self, device: Device) -> None:
        from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

        self.dtype = dtype_on(device, self.spec.dtype)
        self._torch_dtype = getattr(torch, self.dtype)
        self._processor = AutoProcessor.from_pretrained(self.path, local_files_only=True)
        model = AutoModelForSpeechSeq2Seq.from_pretrained(  # safetensors only: no pickles
            self.path, local_files_only=True, dtype=self._torch_dtype, use_safetensors=True
        )
        self._model = model.to(torch_device_of(device)).eval()
        self._device = torch_device_of(device)

    def torch_module(self) -> Any:
        return self._model

    def unload(self) -> None:
        self._model = None
        self._processor = None
        gc.collect()

    # -- what a request may ask ----------------------------------------------------------
    def languages(self) -> list[str]:
        """The language codes its decoder knows (empty: an English-only model)."""
        found = getattr(self._model.generation_config, "lang_to_id", None) or {}
        return sorted(token.strip("<|>") for token in found)

    @property
    def multilingual(self) -> bool:
        return bool(getattr(self._model.generation_config, "is_multilingual", False))

    @property
    def aligns_words(self) -> bool:
        """Whether it can time words: transformers aligns tokens to audio frames by the
        cross-attention of the heads `alignment_heads` names, and refuses without them."""
        return getattr(self._model.generation_config, "alignment_heads", None) is not None

    def language_refused(self, language: str | None, task: str) -> InvalidRequest | None:
        if not self.multilingual:
            if task == "translate" or language not in (None, "en"):
                return InvalidRequest(
                    f"model {self.name!r} is English-only: it transcribes English audio "
                    "and translates nothing",
                    param="language" if task == "transcribe" else "model",
                )
            return None
        known = self.languages()
        if language is not None and language not in known:
            return InvalidRequest(
                f"model {self.name!r} knows no language {language!r}; it knows {', '.join(known)}",
                param="language",
            )
        return None

    # -- the three stages ----------------------------------------------------------------
    def preprocess(self, inputs: list[AudioClip]) -> Prepared:
        """One clip, decoded and cut into windows (the CPU pool)."""
        if len(inputs) != 1 or not isinstance(inputs[0], AudioClip):
            raise InvalidRequest(f"model {self.name!r} takes one audio file", param="file")
        clip = inputs[0]
        if clip.options.words and self._model is not None and not self.aligns_words:
            raise InvalidRequest(
                f"model {self.name!r} cannot time words: its generation_config.json names no "
                "alignment_heads (the cross-attention heads that follow the audio); ask for "
                "segment timestamps",
                param="timestamp_granularities",
            )
        samples = decode_audio(clip.data, clip.max_seconds, clip.lease)
        return self._prepared(windows(samples, clip.options, clip.stop))

    def _prepared(self, rows: list[Window]) -> Prepared:
        words = {row.options.words for row in rows}
        if len(words) != 1:  # merge keeps them apart: they cost differently
            raise ValueError("word and plain windows never share a generate call")
        batch = next_pow2(min(len(rows), self.spec.max_batch))
        seconds = sum(row.samples.size for row in rows) // SAMPLE_RATE
        label = f"w30xb{batch}" + (f"~{WORDS}" if words.pop() else "")
        return Prepared(Bucket(label, batch), rows, seconds, count=len(rows))

    def batch_group(self, prepared: Prepared) -> str:
        return repr(prepared.payload[0].options)

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        """Windows of requests with the same options (words or not among them), however
        many: `forward` runs them `max_batch` to a call, so the bucket (one call's) stays
        within its cap."""
        if len(parts) == 1:
            return parts[0]
        if len({p.payload[0].options for p in parts}) != 1:
            return None
        return self._prepared([row for p in parts for row in p.payload])

    def prior_bytes(self, bucket: Bucket) -> int:
        found = LABEL.match(bucket.label)
        if found is None or self._model is None:
            return 0
        element = torch.finfo(self._torch_dtype).bits // 8
        words = found.group(2) is not None
        return speech_bytes(self._model.config, int(found.group(1)), element, words)

    def stop(self, prepared: Prepared) -> None:
        for row in prepared.payload:
            row.stop.set()

    def forward(self, prepared: Prepared) -> list[Decoded]:
        """Each window's generated tokens, `max_batch` windows to a `generate` call; the
        windows of a request that stopped (`stop`) are skipped from the next call on."""
        self.forward_calls += 1
        rows: list[Window] = prepared.payload
        done: dict[int, Decoded] = {}  # a row's index: its tokens
        step, pending = self.spec.max_batch, list(range(len(rows)))
        while chunk := [i for i in pending if not rows[i].stop.is_set()][:step]:
            done.update(zip(chunk, self._generate([rows[i] for i in chunk]), strict=True))
            pending = [i for i in pending if i not in done]
            self.progress_at = time.monotonic()  # a long file's windows: the watchdog sees life
        return [
            done[i] if i in done else Decoded(row, [], None, stopped=True)
            for i, row in enumerate(rows)
        ]

    def _generate(self, chunk: list[Window]) -> list[Decoded]:
        self.generate_calls += 1
        options = chunk[0].options
        found = self._processor.feature_extractor(
            [row.samples for row in chunk],
            sampling_rate=SAMPLE_RATE,
            return_tensors="pt",
            return_attention_mask=options.words,
        )
        features = found.input_features.to(self._device, self._torch_dtype)
        # one sequence a window, whatever num_beams the model's generation config names
        # (see the module's docstring: the pipeline's own default searches 5 beams)
        kwargs: dict[str, Any] = {"return_timestamps": True, "task": options.task, "num_beams": 1}
        if self.multilingual:
            kwargs["language"] = options.language
        else:
            kwargs.pop("task")
        if options.words:  # as the ASR pipeline asks for them (return_timestamps="word")
            kwargs.update(return_token_timestamps=True, return_segments=True)
            kwargs["attention_mask"] = found.attention_mask.to(self._device)  # each one's frames
        if options.prompt:
            ids = self._processor.get_prompt_ids(options.prompt, return_tensors="pt")
            kwargs["prompt_ids"] = ids.to(self._device)
        if options.temperature > 0:
            kwargs.update(do_sample=True, temperature=options.temperature)
        config = self._model.config
        with self._generate_lock, torch.inference_mode():
            attention = config._attn_implementation
            try:
                tokens = self._model.generate(features, **kwargs)
            finally:  # transformers leaves it eager after word timestamps
                config._attn_implementation = attention
        sequences = tokens["sequences"] if isinstance(tokens, dict) else tokens
        rows = [row.tolist() for row in sequences.cpu()]
        if not options.words:
            return [Decoded(window, row, None) for window, row in zip(chunk, rows, strict=True)]
        return [
            _with_times(window, row, parts)
            for window, row, parts in zip(chunk, rows, tokens["segments"], strict=True)
        ]

    def postprocess(self, raw: list[Decoded]) -> list[WindowText]:
        return [self._window_text(decoded) for decoded in raw]

    def _window_text(self, decoded: Decoded) -> WindowText:
        """A window's tokens as transformers' ASR pipeline turns a chunk's into text and
        timed chunks (its tokenizer's `_decode_asr`, what the pipeline's postprocess
        calls), placed in the clip: segments, and words where they were asked for. A
        window of a stopped request is empty (its answer is dropped)."""
        window, options = decoded.window, decoded.window.options
        if decoded.stopped:
            return WindowText(
                window.start_s, window.end_s, "", (), (),
                options.task, options.language, options.temperature,
            )  # fmt: skip
        text, segments = self._timed(decoded, True)
        words = self._timed(decoded, "word")[1] if decoded.times is not None else ()
        return WindowText(
            window.start_s,
            window.end_s,
            text,
            segments,
            tuple(Segment(w.start, w.end, w.text.strip()) for w in words),
            options.task,
            options.language,
            options.temperature,
        )

    def _timed(self, decoded: Decoded, granularity: bool | str) -> tuple[str, tuple[Segment, ...]]:
        window = decoded.window
        output: dict[str, Any] = {
            "tokens": torch.tensor([decoded.tokens]),
            "stride": (window.samples.size / SAMPLE_RATE, 0.0, 0.0),
        }
        if decoded.times is not None:
            output["token_timestamps"] = decoded.times[None]
        extractor = self._processor.feature_extractor
        text, found = self._processor.tokenizer._decode_asr(
            [output],
            return_timestamps=granularity,
            return_language=False,
            time_precision=extractor.chunk_length / self._model.config.max_source_positions,
        )
        timed, previous = [], 0.0
        for chunk in found.get("chunks", []):
            start, end = _stamped(chunk["timestamp"], previous)
            previous = end
            timed.append(Segment(*placed(start, end, *window.span), chunk["text"]))
        return text, tuple(timed)

    # -- warm-up and probe ---------------------------------------------------------------
    def prime(self) -> None:
        self.postprocess(self.forward(self.preprocess(self.probe_input())))
        self.forward_calls = self.generate_calls = 0

    def probe_clip(self) -> AudioClip:
        return AudioClip(silent_wav(1.0), float(WINDOW_S), SpeechOptions(language=None))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": str(self.path)}


@dataclass(frozen=True)
class Decoded:
    """A window's generated tokens and, where words were asked for, each token's time in
    the window (seconds, from the cross-attention alignment)."""

    window: Window
    tokens: list[int]
    times: torch.Tensor | None
    stopped: bool = False  # its request stopped before this window ran: never generated


def _with_times(window: Window, tokens: list[int], parts: list[dict[str, Any]]) -> Decoded:
    """A row of a batched `generate` with its token times, as the pipeline joins them (its
    segments' `token_timestamps`, end to end). A row that ended before the longest is
    padded after its end: the padding, which has no times, is cut off."""
    times = torch.cat([part["token_timestamps"].cpu() for part in parts])
    return Decoded(window, tokens[: times.numel()], times)


def _stamped(stamp: tuple[float | None, float | None], previous: float) -> tuple[float, float]:
    """A chunk's (start, end) in its window. Whisper may write text with no timestamp
    before or after it (audio cut mid-word; transformers then says None and logs "Whisper
    did not predict an ending timestamp"): a missing start is where the previous chunk
    ended, a missing end is the start."""
    start = previous if stamp[0] is None else stamp[0]
    return start, start if stamp[1] is None else stamp[1]


def silent_wav(seconds: float) -> bytes:
    """`seconds` of 16 kHz silence as a WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(SAMPLE_RATE)
        writer.writeframes(np.zeros(int(seconds * SAMPLE_RATE), dtype="<i2").tobytes())
    return out.getvalue()
