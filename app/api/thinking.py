"""What every API's reply needs to read a reasoning model's answer: the frame its engine
rendered the chat in (app.models.chat.reasoning), so that its thinking comes apart from its
answer the same way on every route and engine."""

from __future__ import annotations

from app.core.work import AdmittedGeneration
from app.models.chat.reasoning import Frame
from app.models.decoding import GenerationInput


def frame_of(generation: AdmittedGeneration) -> Frame | None:
    """How a generation's answer thinks, as its engine rendered the chat (None: not in
    tags, or no chat: a completion's prompt is the caller's own)."""
    payload = generation.job.prepared.payload
    return payload.thinking if isinstance(payload, GenerationInput) else None
