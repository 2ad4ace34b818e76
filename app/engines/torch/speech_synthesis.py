"""Text to speech through transformers, safetensors only: a VITS folder (MMS-TTS and the
like: `VitsModel` and its `VitsTokenizer`), or a SpeechT5 one (`SpeechT5ForTextToSpeech`
and its tokenizer, with its HiFi-GAN vocoder in a `vocoder` folder inside it and, where
it has several voices, their speaker embeddings in `speakers.safetensors`).

A request's text (one part of its input, app.api.audio.speech splits it at sentence
ends) is tokenised on the CPU pool; rows of one or several requests run in one forward
(app.engines.torch.vits, app.engines.torch.speecht5: each row's noise or dropout from its
own seed, its padding masked), each row the speech it would be alone. Bucket: `sNxbM`, N
the longest row's tokens divided by its speed (a slow row lasts as long as a longer
text) rounded up to a power of two, M the rows rounded up likewise, as embedders'
(app.models.prepared.length_bucketed). The first quote comes from the config (each
family's `activation_bytes`); every run teaches its bucket.
"""

from __future__ import annotations

import gc
import json
import math
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.config.settings import ModelSpec
from app.devices.base import Device
from app.devices.torch_backed import torch_device_of
from app.engines.torch import speecht5, vits
from app.engines.torch.module import TorchModule
from app.engines.torch.vits import Row
from app.models.base import weight_file_bytes
from app.models.kinds import Speech, SpeechSynthesizer, Utterance
from app.models.prepared import Bucket, Prepared, length_bucketed, merged_rows
from app.models.stages import InThreads

LABEL = re.compile(r"^s(\d+)xb(\d+)$")
# SpeechT5's voices: one speaker embedding (x-vector) per row of this file's tensor, in
# OpenAI's voice order; without it, one voice (a zero embedding: the text alone)
SPEAKERS_FILE = "speakers.safetensors"
SPEAKERS_TENSOR = "speakers"
VOCODER_FOLDER = "vocoder"


class SpeechSynthesisHandler(InThreads, TorchModule, SpeechSynthesizer):
    kind = "speech_synthesis"
    preprocess_on_loop = False  # tokenising MMS-TTS's Python tokenizer, on the CPU pool
    postprocess_on_loop = False  # each row's samples copied out

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        assert spec.path is not None, "ModelSpec checks that a speech model has a path"
        self.path = Path(spec.path)
        self.family = "vits"  # or "speecht5": the folder's config says, at load
        self._model: Any = None
        self._tokenizer: Any = None
        self._vocoder: Any = None  # SpeechT5's HiFi-GAN
        self._voices: Any = None  # SpeechT5's speaker embeddings, one row per voice
        self._known: frozenset[str] = frozenset()
        self.rate = 16_000
        # the tokenizer is a Python object the CPU pool's threads would share
        self._tokenizer_lock = threading.Lock()

    def expected_weights_bytes(self, device: Device) -> int:
        return weight_file_bytes(self.path, 4)

    def load(self, device: Device) -> None:
        config = json.loads((self.path / "config.json").read_text(encoding="utf-8"))
        self.family = "speecht5" if config.get("model_type") == "speecht5" else "vits"
        # float32 everywhere: VITS's flows invert rational-quadratic splines, which half
        # precision bends, and the models are small (MMS-TTS 36M, SpeechT5 144M)
        self.dtype = "float32"
        if self.family == "speecht5":
            self._load_speecht5()
        else:
            self._load_vits()
        self._model = self._model.to(torch_device_of(device)).eval()
        if self._vocoder is not None:
            self._vocoder = self._vocoder.to(torch_device_of(device)).eval()
        vocabulary = self._tokenizer.get_vocab()
        self._known = frozenset(c for c in vocabulary if len(c) == 1 and c.isalnum())

    def _load_vits(self) -> None:
        from transformers import VitsModel, VitsTokenizer

        self._tokenizer = VitsTokenizer.from_pretrained(self.path, local_files_only=True)
        self._model = VitsModel.from_pretrained(  # safetensors only: no pickles
            self.path, local_files_only=True, dtype=torch.float32, use_safetensors=True
        )
        self.speakers = int(self._model.config.num_speakers)
        self.rate = int(self._model.config.sampling_rate)

    def _load_speecht5(self) -> None:
        from safetensors.torch import load_file
        from transformers import SpeechT5ForTextToSpeech, SpeechT5HifiGan, SpeechT5Tokenizer

        vocoder = self.path / VOCODER_FOLDER
        if not (vocoder / "config.json").is_file():
            raise FileNotFoundError(
                f"{self.path.name} is a SpeechT5 model, which speaks through a HiFi-GAN "
                f"vocoder: put one (microsoft/speecht5_hifigan's folder) at {vocoder}"
            )
        safe = {"local_files_only": True, "dtype": torch.float32, "use_safetensors": True}
        self._tokenizer = SpeechT5Tokenizer.from_pretrained(self.path, local_files_only=True)
        self._model = SpeechT5ForTextToSpeech.from_pretrained(self.path, **safe)
        self._vocoder = SpeechT5HifiGan.from_pretrained(vocoder, **safe)
        width = int(self._model.config.speaker_embedding_dim)
        speakers = self.path / SPEAKERS_FILE
        voices = torch.zeros((1, width))
        if speakers.is_file():
            voices = load_file(speakers).get(SPEAKERS_TENSOR, torch.zeros((0, width)))
            if voices.ndim != 2 or voices.size(0) < 1 or voices.size(1) != width:
                raise ValueError(
                    f"{speakers}: its {SPEAKERS_TENSOR!r} tensor must be (voices, {width}), "
                    f"one speaker embedding per voice; it is {tuple(voices.shape)}"
                )
        self._voices = voices.float()
        self.speakers = int(voices.size(0))
        self.rate = int(self._vocoder.config.sampling_rate)

    def torch_module(self) -> Any:
        return self._model

    def unload(self) -> None:
        self._model = None
        self._tokenizer = None
        self._vocoder = None
        self._voices = None
        gc.collect()

    def speakable(self, text: str) -> bool:
        """Whether `text` holds a letter or digit this model's vocabulary has (its
        tokenizer drops the rest)."""
        known = self._known
        return any(c in known for c in text.lower()) if known else bool(text.strip())

    # -- the three stages ----------------------------------------------------------------
    def preprocess(self, inputs: list[Utterance]) -> Prepared:
        with self._tokenizer_lock:
            rows = [
                Row(self._tokenizer(u.text).input_ids, self.speaker_of(u.voice), u.speed, u.seed)
                for u in inputs
            ]
        return self._prepared(rows)

    def _prepared(self, rows: list[Row]) -> Prepared:
        lengths = [math.ceil(len(row.ids) / row.speed) for row in rows]
        found = length_bucketed(rows, lengths, self.spec.max_batch)
        return Prepared(found.bucket, rows, sum(len(row.ids) for row in rows), len(rows))

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        return merged_rows(parts, self.spec.max_batch, self._prepared)

    def prior_bytes(self, bucket: Bucket) -> int:
        found = LABEL.match(bucket.label)
        if found is None or self._model is None:
            return 0
        tokens, rows = int(found.group(1)), int(found.group(2))
        if self.family == "speecht5":
            vocoder = self._vocoder.config
            return speecht5.activation_bytes(self._model.config, vocoder, tokens, rows)
        return vits.activation_bytes(self._model.config, tokens, rows)

    def forward(self, prepared: Prepared) -> list[np.ndarray]:
        self.forward_calls += 1
        with torch.inference_mode():
            if self.family == "speecht5":
                rows = prepared.payload
                waves = speecht5.synthesize(self._model, self._vocoder, rows, self._voices)
            else:
                waves = vits.synthesize(self._model, prepared.payload)
        return [wave.float().cpu().numpy() for wave in waves]

    def postprocess(self, raw: list[np.ndarray]) -> list[Speech]:
        return [Speech(np.ascontiguousarray(wave, dtype=np.float32), self.rate) for wave in raw]

    def prime(self) -> None:
        self.postprocess(self.forward(self.preprocess(self.probe_input())))
        self.forward_calls = 0

    def describe(self) -> dict[str, Any]:
        described = {"path": str(self.path), "family": self.family, "speakers": self.speakers}
        return {**super().describe(), **described}
