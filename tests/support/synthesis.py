"""The text-to-speech handler loaded on the CPU from a folder, and what it speaks: for the
engine tests of each family (VITS, SpeechT5)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.config.settings import ModelSpec
from app.devices.cpu import CpuDevice
from app.engines.torch.speech_synthesis import SpeechSynthesisHandler
from app.models.kinds import Utterance


def loaded(folder: Path, max_batch: int = 4) -> SpeechSynthesisHandler:
    spec = ModelSpec(name="tts", kind="speech_synthesis", path=folder, max_batch=max_batch)
    handler = SpeechSynthesisHandler(spec)
    handler.load(CpuDevice())
    return handler


def spoken(handler: SpeechSynthesisHandler, rows: list[Utterance]) -> list[np.ndarray]:
    """Each row's samples, the rows in one forward."""
    prepared = handler.preprocess(rows)
    return [speech.samples for speech in handler.postprocess(handler.forward(prepared))]


def spoken_together(handler: SpeechSynthesisHandler, rows: list[Utterance]) -> list[np.ndarray]:
    """Each row's samples, the rows prepared one by one and merged as the batcher merges
    requests."""
    merged = handler.merge([handler.preprocess([row]) for row in rows])
    assert merged is not None and merged.count == len(rows)
    return [speech.samples for speech in handler.postprocess(handler.forward(merged))]
