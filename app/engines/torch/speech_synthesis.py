"""Text to speech: a VITS folder (MMS-TTS and the like: `VitsModel` and its
`VitsTokenizer`) through transformers, safetensors only.

A request's text (one part of its input, app.api.audio.speech splits it at sentence
ends) is tokenised on the CPU pool; rows of one or several requests run in one forward
(app.engines.torch.vits: each row's noise from its own seed, its padding masked), each
row the speech it would be alone. Bucket: `sNxbM`, N the longest row's tokens divided by
its speed (a slow row lasts as long as a longer text) rounded up to a power of two, M the
rows rounded up likewise, as embedders' (app.models.prepared.length_bucketed). The first
quote comes from the config (app.engines.torch.vits.activation_bytes); every run teaches its bucket.
"""

from __future__ import annotations

import gc
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
from app.engines.torch.module import TorchModule
from app.engines.torch.vits import Row, activation_bytes, synthesize
from app.models.base import weight_file_bytes
from app.models.kinds import Speech, SpeechSynthesizer, Utterance
from app.models.prepared import Bucket, Prepared, length_bucketed, merged_rows
from app.models.stages import InThreads

LABEL = re.compile(r"^s(\d+)xb(\d+)$")


class SpeechSynthesisHandler(InThreads, TorchModule, SpeechSynthesizer):
    kind = "speech_synthesis"
    preprocess_on_loop = False  # tokenising MMS-TTS's Python tokenizer, on the CPU pool
    postprocess_on_loop = False  # each row's samples copied out

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        assert spec.path is not None, "ModelSpec checks that a speech model has a path"
        self.path = Path(spec.path)
        self._model: Any = None
        self._tokenizer: Any = None
        self._known: frozenset[str] = frozenset()
        self.rate = 16_000
        # the tokenizer is a Python object the CPU pool's threads would share
        self._tokenizer_lock = threading.Lock()

    def expected_weights_bytes(self, device: Device) -> int:
        return weight_file_bytes(self.path, 4)

    def load(self, device: Device) -> None:
        from transformers import VitsModel, VitsTokenizer

        # float32 everywhere: its flows invert rational-quadratic splines, which half
        # precision bends, and the model is small (MMS-TTS: 36M parameters)
        self.dtype = "float32"
        self._tokenizer = VitsTokenizer.from_pretrained(self.path, local_files_only=True)
        model = VitsModel.from_pretrained(  # safetensors only: no pickles
            self.path, local_files_only=True, dtype=torch.float32, use_safetensors=True
        )
        self._model = model.to(torch_device_of(device)).eval()
        self.speakers = int(model.config.num_speakers)
        self.rate = int(model.config.sampling_rate)
        vocabulary = self._tokenizer.get_vocab()
        self._known = frozenset(c for c in vocabulary if len(c) == 1 and c.isalnum())

    def torch_module(self) -> Any:
        return self._model

    def unload(self) -> None:
        self._model = None
        self._tokenizer = None
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
        return activation_bytes(self._model.config, int(found.group(1)), int(found.group(2)))

    def forward(self, prepared: Prepared) -> list[np.ndarray]:
        self.forward_calls += 1
        with torch.inference_mode():
            waves = synthesize(self._model, prepared.payload)
        return [wave.float().cpu().numpy() for wave in waves]

    def postprocess(self, raw: list[np.ndarray]) -> list[Speech]:
        return [Speech(np.ascontiguousarray(wave, dtype=np.float32), self.rate) for wave in raw]

    def prime(self) -> None:
        self.postprocess(self.forward(self.preprocess(self.probe_input())))
        self.forward_calls = 0

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": str(self.path), "speakers": self.speakers}
