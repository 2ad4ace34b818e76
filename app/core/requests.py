"""Validated requests: what the routes hand the core. Each is built by app.api.openai.schemas
after every check that needs no model (bounds, lengths, formats) has passed.

A one-shot request (inputs in, one output row each, out) is a `OneShotRequest`: it names
the capability it needs (an app.models.kinds contract) and its inputs, and may refuse
what only its model can judge and shape what its model gave. The core runs every such
request through one door (`InferenceService.run`, `Fleet.run`): a new kind of one-shot
model adds a request type and a capability, not a method in each."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from app.core.overflow import Overflow
from app.errors import InvalidRequest
from app.models.audio import AudioClip, SpeechOptions
from app.models.decoding import Prompt, SamplingParams
from app.models.image_prompt import ImagePrompt
from app.models.kinds import (
    Embedder,
    ImageGenerator,
    ImageModel,
    OneShotModel,
    Reranker,
    SpeechSynthesizer,
    Transcriber,
    Utterance,
)
from app.models.transcript import Transcript
from app.sched.host_bytes import HostLease

if TYPE_CHECKING:
    from app.core.work import InferenceResult
    from app.errors import VramgateError


class OneShotRequest:
    """What the core needs of a validated one-shot request."""

    model: str
    keep_alive: float | None  # seconds its model stays loaded idle (inf: for good)
    capability: ClassVar[type[OneShotModel[Any]]]

    def items(self) -> list[Any]:
        """The inputs its model's preprocess takes, one row each."""
        raise NotImplementedError

    def refusal(self, handler: Any) -> VramgateError | None:
        """Why its model cannot serve it (a check that needs the model); None: it can."""
        return None

    def finish(self, handler: Any, result: InferenceResult) -> InferenceResult:
        """The model's rows as the caller asked for them."""
        return result


@dataclass(frozen=True)
class ValidEmbeddingRequest(OneShotRequest):
    model: str
    inputs: list[str | list[int]]  # texts, or token ids of the model's own tokenizer
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    keep_alive: float | None = None
    capability: ClassVar[type[OneShotModel[Any]]] = Embedder

    def items(self) -> list[Any]:
        return list(self.inputs)

    def refusal(self, handler: Embedder) -> VramgateError | None:
        return handler.width_refused(self.model, self.dimensions)

    def finish(self, handler: Embedder, result: InferenceResult) -> InferenceResult:
        if self.dimensions is None:
            return result
        return replace(result, output=handler.cut(result.output, self.dimensions))


@dataclass(frozen=True)
class ValidImageRequest(OneShotRequest):
    model: str
    images: list[bytes]
    top_k: int = 5
    keep_alive: float | None = None
    capability: ClassVar[type[OneShotModel[Any]]] = ImageModel

    def items(self) -> list[Any]:
        return list(self.images)


@dataclass(frozen=True)
class ValidGenerationRequest:
    model: str
    prompt: Prompt
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    n: int = 1  # choices: each runs as a stream of its own
    tool_mode: str = "none"  # "auto": the answer may be a tool call; "forced": it must be
    tool_names: frozenset[str] = frozenset()
    echo: bool = False  # completions: the answer begins with the prompt
    parallel_tool_calls: bool = True  # False: at most one tool call in an answer
    keep_alive: float | None = None
    overflow: Overflow = "error"  # a chat past the context: app.core.overflow


@dataclass(frozen=True)
class ValidRerankRequest(OneShotRequest):
    model: str
    query: str
    documents: list[str]
    top_n: int | None = None  # None: every document
    return_documents: bool = False
    keep_alive: float | None = None
    capability: ClassVar[type[OneShotModel[Any]]] = Reranker

    def items(self) -> list[Any]:
        """(query, document) pairs, in the documents' order."""
        return [(self.query, document) for document in self.documents]


@dataclass(frozen=True)
class ValidImageGeneration(OneShotRequest):
    """`n` images of one prompt: `first` is row 0, and row i is it with seed `first.seed
    + i` (all rows share its `progress`, which the route cancels when its client
    leaves)."""

    model: str
    first: ImagePrompt
    n: int
    keep_alive: float | None = None
    capability: ClassVar[type[OneShotModel[Any]]] = ImageGenerator

    def items(self) -> list[Any]:
        return [replace(self.first, seed=self.first.seed + i) for i in range(self.n)]

    def finish(self, handler: ImageGenerator, result: InferenceResult) -> InferenceResult:
        """Its images, and what the answer tells of its prompts: the end of one its
        model's text encoder did not see (a CLIP encoder sees 77 tokens; diffusers cuts
        the rest and logs it only)."""
        first, warnings = self.first, []
        for field, text in (("prompt", first.prompt), ("negative_prompt", first.negative_prompt)):
            unseen = handler.prompt_unseen(text or "")
            if unseen is not None:
                shown = unseen if len(unseen) <= 80 else unseen[:77] + "..."
                warnings.append(
                    f"{field} is longer than model {self.model!r}'s text encoder reads; "
                    f"this end of it was cut: {shown!r}"
                )
        return replace(result, warnings=(*result.warnings, *warnings))

    def refusal(self, handler: ImageGenerator) -> VramgateError | None:
        if self.n > handler.spec.max_batch:
            return InvalidRequest(
                f"model {self.model!r} makes at most {handler.spec.max_batch} images at once "
                f"(its max_batch); n={self.n}",
                param="n",
            )
        width, height = self.first.width, self.first.height
        if width is None or height is None:
            return None
        return handler.size_refused(width, height)


@dataclass(frozen=True)
class ValidTranscription(OneShotRequest):
    """One audio file to text (or, with task `translate`, to English). Its one input is
    the still-encoded clip: decoded and cut into windows by its model's preprocess, on
    the CPU pool; its rows (windows) come back as one `Transcript`."""

    model: str
    audio: bytes
    options: SpeechOptions
    max_seconds: float
    keep_alive: float | None = None
    lease: HostLease | None = None  # its share of max_audio_bytes (the route closes it)
    capability: ClassVar[type[OneShotModel[Any]]] = Transcriber

    def items(self) -> list[Any]:
        return [AudioClip(self.audio, self.max_seconds, self.options, self.lease)]

    def refusal(self, handler: Transcriber) -> VramgateError | None:
        return handler.language_refused(self.options.language, self.options.task)

    def finish(self, handler: Transcriber, result: InferenceResult) -> InferenceResult:
        return replace(result, output=Transcript.of(list(result.output)))


@dataclass(frozen=True)
class ValidSpeech(OneShotRequest):
    """One part of a text to speak (app.api.audio.speech splits a long input at sentence
    ends and sends each part as a request of its own, so the parts batch together and
    the first is heard before the last is spoken). `whole`: the request's whole input, on
    its first part only, so that an input with nothing its model can speak is a 400
    before anything is queued."""

    model: str
    utterance: Utterance
    whole: str | None = None
    keep_alive: float | None = None
    capability: ClassVar[type[OneShotModel[Any]]] = SpeechSynthesizer

    def items(self) -> list[Any]:
        return [self.utterance]

    def refusal(self, handler: SpeechSynthesizer) -> VramgateError | None:
        if self.whole is not None and not handler.speakable(self.whole):
            return InvalidRequest(
                f"model {self.model!r} can speak none of the input's characters",
                param="input",
            )
        return handler.voice_refused(self.utterance.voice)

    def finish(self, handler: SpeechSynthesizer, result: InferenceResult) -> InferenceResult:
        """Its speech, and where its model has one voice, that the voice asked for was
        not used."""
        if handler.speakers > 1:
            return result
        said = f"voice {self.utterance.voice!a} is ignored: model {self.model!r} has one voice."
        return replace(result, warnings=(*result.warnings, said))
