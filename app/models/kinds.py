"""The capability contracts: one per thing a model can do, checked by type.

- `Embedder`: texts or token ids → vectors (`/v1/embeddings`).
- `ImageModel`: encoded images → class scores or images (`/v1/models/{name}/predict`).
- `Generator`: a prompt or chat → text, token by token (`/v1/chat/completions`,
  `/v1/completions`).
- `Reranker`: (query, document) pairs → relevance scores (`/v1/rerank`).
- `ImageGenerator`: prompts → encoded images (`/v1/images/generations`).
- `Transcriber`: audio files → timed text (`/v1/audio/transcriptions`, `/translations`).
- `SpeechSynthesizer`: texts → speech samples (`/v1/audio/speech`).

A request to any model passes the stages of app.models.stages: prepared (tokenised or
decoded, bucketed), started (the only stage that holds device memory), finished. Where
each runs is the engine's: an in-process engine's handlers mix in `InThreads` and write
`preprocess` / `forward` / `postprocess` (one-shot) or `prepare_generation` / `generate`;
a runner's handlers await their process on the loop. A handler inherits every contract
it fulfils (the simulated model fulfils several); the registry checks at load that each
handler fulfils at least one, and the service asks for the one a route needs.
"""

from __future__ import annotations

import contextlib
import threading
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

import numpy as np

from app.config.settings import ModelSpec
from app.errors import InvalidImageSize, InvalidRequest, WrongModelKind
from app.models.audio import AudioClip
from app.models.base import Exercises, ModelHandler
from app.models.card import ModelCard
from app.models.decoding import Prompt, SamplingParams
from app.models.image_buckets import group_of, is_tiled, merged, row_shape, rows_prepared
from app.models.image_prompt import ImageProgress, ImagePrompt
from app.models.prepared import Prepared
from app.models.stages import Pools
from app.sched.budget import Geometry

In = TypeVar("In")


class OneShotModel(ModelHandler, Generic[In]):
    """Inputs of type `In` in, one output row per input out, in one forward."""

    @abstractmethod
    async def prepare_inputs(self, inputs: list[In], pools: Pools) -> Prepared:
        """A request's inputs tokenised or decoded, and bucketed."""

    @property
    def batchable(self) -> bool:
        return self.spec.max_batch > 1

    @abstractmethod
    def warmup_inputs(self) -> list[list[In]]:
        """Requests run once after loading so the common buckets have learned prices."""

    @abstractmethod
    def probe_input(self) -> list[In]:
        """The tiny real inference of the readiness check."""

    def exercises(self, probe_only: bool) -> Exercises:
        capability = next(c for c in type(self).__mro__ if c in ONE_SHOT)
        batches = [self.probe_input()] if probe_only else self.warmup_inputs()
        return Exercises(capability, tuple(batches))


TextOrIds = str | list[int]  # a text, or token ids of the model's own tokenizer


class Embedder(OneShotModel[TextOrIds]):
    """Texts (or token ids) to float32 vectors, `dimensions` wide: `postprocess` gives a
    float32 array, one row per input, in the caller's order."""

    capability_names = ("embedding",)

    dimensions: int = 0
    # Narrower widths its vectors keep their meaning at (Matryoshka training): a request's
    # `dimensions` may ask for one; the vector is cut to it and normalised again.
    truncations: tuple[int, ...] = ()

    def width_refused(self, model: str, width: int | None) -> InvalidRequest | None:
        """Why a request's `dimensions` cannot be served (None: it can, or none asked)."""
        widths = sorted({self.dimensions, *self.truncations})
        if width is None or width in widths:
            return None
        return InvalidRequest(
            f"model {model!r} makes vectors of {widths} dimensions; "
            f"dimensions={width} is not supported",
            param="dimensions",
        )

    def cut(self, vectors: np.ndarray, width: int) -> np.ndarray:
        """`vectors` cut to `width` (one of `truncations`) and normalised again."""
        if width >= self.dimensions:
            return vectors
        cut = vectors[:, :width]
        return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)

    def warmup_inputs(self) -> list[list[TextOrIds]]:
        return [["warm up"]]

    def probe_input(self) -> list[TextOrIds]:
        return ["ok"]


class ImageModel(OneShotModel[bytes]):
    """Encoded images (PNG, JPEG, ...) to class scores (an array) or images (PNG bytes)."""

    labels: Sequence[str] = ()  # the class names of a classifier's scores, in order
    capability_names = ("image",)

    def card(self) -> ModelCard:
        return replace(super().card(), labels=tuple(self.labels))

    @abstractmethod
    def warmup_image(self) -> bytes:
        """An encoded image this model takes: its warm-up and its probe."""

    def warmup_inputs(self) -> list[list[bytes]]:
        return [[self.warmup_image()]]

    def probe_input(self) -> list[bytes]:
        return [self.warmup_image()]


Pair = tuple[str, str]  # (query, document)


class Reranker(OneShotModel[Pair]):
    """(query, document) pairs to relevance scores (a cross-encoder): `postprocess`
    gives a float32 array, one score per pair, in the caller's order."""

    capability_names = ("rerank",)

    def warmup_inputs(self) -> list[list[Pair]]:
        return [[("warm up", "a document to warm up with")]]

    def probe_input(self) -> list[Pair]:
        return [("ok", "ok")]


class ImageGenerator(OneShotModel[ImagePrompt]):
    """Prompts to images (text-to-image diffusion): one row per `ImagePrompt`, and
    `postprocess` gives each row's image encoded in its `output_format`, in order. Rows
    are bucketed and batched by app.models.image_buckets; `prior_bytes` prices both a
    bucket and its tiled variant, and a tiled run is offered (`leaner`) where it is
    cheaper."""

    capability_names = ("image_generation",)

    grid = 8  # widths and heights it makes are multiples of this
    default_size = (512, 512)  # (width, height) when a request says `auto`
    max_side, max_pixels = 4096, 2**24  # the server's bounds (the registry sets them)

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self._runs_lock = threading.Lock()  # guards _runs: written by inference threads
        self._runs: dict[int, tuple[str, list[ImageProgress]]] = {}

    @contextlib.contextmanager
    def batch_running(self, prepared: Prepared) -> Iterator[list[ImageProgress]]:
        """While a batch runs: its requests' progresses (one per request), listed by
        `running` for /status, the tray and the dashboard."""
        rows: list[ImagePrompt] = prepared.payload
        progresses = list({id(row.progress): row.progress for row in rows}.values())
        with self._runs_lock:
            self._runs[id(prepared)] = (prepared.bucket.label, progresses)
        try:
            yield progresses
        finally:
            with self._runs_lock:
                del self._runs[id(prepared)]

    def running(self) -> list[dict[str, Any]]:
        """The batches running now: their bucket and each request's [step, steps]."""
        with self._runs_lock:
            batches = list(self._runs.values())
        return [
            {"bucket": label, "steps": [list(p.read()) for p in progresses]}
            for label, progresses in batches
        ]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "running": self.running()}

    def card(self) -> ModelCard:
        return replace(super().card(), image_size=self.default_size)

    def preview(self) -> np.ndarray | None:
        """The running batch's latest preview (RGB, height × width × 3), or None."""
        return None

    def size_refused(self, width: int, height: int) -> InvalidImageSize | None:
        """Why this model cannot make a `width`×`height` image (None: it can)."""
        if width % self.grid or height % self.grid:
            return InvalidImageSize(
                f"model {self.name!r} makes images whose sides are multiples of "
                f"{self.grid}; {width}x{height} is not",
                param="size",
            )
        if max(width, height) > self.max_side or width * height > self.max_pixels:
            return InvalidImageSize(
                f"{width}x{height} is beyond this server's bounds: at most {self.max_side} "
                f"pixels a side and {self.max_pixels} pixels",
                param="size",
            )
        return None

    def preprocess(self, inputs: list[ImagePrompt]) -> Prepared:
        """A request's rows (one shape) with the default size filled in, checked."""
        width, height = self.default_size
        rows = [
            replace(row, width=row.width or width, height=row.height or height) for row in inputs
        ]
        first = rows[0]
        assert first.width is not None and first.height is not None
        refused = self.size_refused(first.width, first.height)
        if refused is not None:
            raise refused
        assert all(row_shape(row) == row_shape(first) for row in rows), "a request's rows share one"
        return rows_prepared(rows)

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        return merged(parts, self.spec.max_batch)

    def batch_group(self, prepared: Prepared) -> str:
        return group_of(prepared)

    def prompt_unseen(self, prompt: str) -> str | None:
        """The end of `prompt` that its text encoder never sees (cut at its window), or
        None when it sees it all."""
        return None

    def leaner(self, prepared: Prepared) -> Prepared | None:
        """Its images decoded in tiles, where the model's prior says that costs less."""
        if is_tiled(prepared):
            return None
        tiled = rows_prepared(prepared.payload, tiled=True)
        if self.prior_bytes(tiled.bucket) >= self.prior_bytes(prepared.bucket):
            return None
        return tiled

    def warmup_inputs(self) -> list[list[ImagePrompt]]:
        """Its default size, one step: the price of a size does not depend on steps."""
        width, height = self.default_size
        return [[ImagePrompt("warm up", seed=0, width=width, height=height, steps=1)]]

    def probe_input(self) -> list[ImagePrompt]:
        side = 8 * self.grid
        return [ImagePrompt("ok", seed=0, width=side, height=side, steps=1)]


class Transcriber(OneShotModel[AudioClip]):
    """Audio files to text (speech recognition, Whisper): `preprocess` decodes one clip
    and cuts it into 30-second windows, one row each; `postprocess` gives each window's
    `WindowText` (app.models.transcript), in order."""

    capability_names = ("transcription",)

    def language_refused(self, language: str | None, task: str) -> InvalidRequest | None:
        """Why this model cannot take `language` or `task` (None: it can)."""
        return None

    def warmup_inputs(self) -> list[list[AudioClip]]:
        return [[self.probe_clip()]]

    def probe_input(self) -> list[AudioClip]:
        return [self.probe_clip()]

    @abstractmethod
    def probe_clip(self) -> AudioClip:
        """An encoded second of audio this model takes: its warm-up and its probe."""


class Generator(ModelHandler):
    """A prompt or a chat to text, decoded step by step into a TokenStream: started with
    a stream (`start`), whose text flows as it is decoded and which stops before the
    next step once `stream.cancelled` is set."""

    capability_names = ("completion", "tools")

    @abstractmethod
    async def prepare_prompt(
        self, prompt: Prompt, params: SamplingParams, default_max_tokens: int, pools: Pools
    ) -> Prepared:
        """Tokenise a prompt or chat and bucket it (see app.models.decoding)."""

    @abstractmethod
    def geometry(self, prompt_tokens: int) -> Geometry:
        """A generation's cost from the model's config, before any measurement: KV bytes
        per token and the prefill's activations for a prompt of `prompt_tokens`."""

    def kv_geometry(self, prompt_tokens: int) -> Geometry | None:
        return self.geometry(prompt_tokens)

    def warmup_prompts(self) -> list[str]:
        return ["Say hello."]

    def probe_prompt(self) -> str:
        return "ok"

    def exercises(self, probe_only: bool) -> Exercises:
        prompts = [self.probe_prompt()] if probe_only else self.warmup_prompts()
        return Exercises(prompts=tuple(prompts))


# OpenAI's voice names, in the order they map to a many-speaker model's speaker ids
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer",
    "verse", "marin", "cedar",
)  # fmt: skip


@dataclass(frozen=True)
class Utterance:
    """A text to speak (one part of a request's input): the voice asked for, its speed
    (1.0: the model's own) and the seed of its noise (the same seed, the same speech)."""

    text: str
    voice: str = "alloy"
    speed: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class Speech:
    """An utterance spoken: mono float32 samples in [-1, 1] at `rate` Hz."""

    samples: np.ndarray
    rate: int

    @property
    def seconds(self) -> float:
        return self.samples.size / self.rate


class SpeechSynthesizer(OneShotModel[Utterance]):
    """Texts to speech (VITS, MMS-TTS, SpeechT5): one row per `Utterance`, and
    `postprocess` gives each row's `Speech`, in order."""

    capability_names = ("speech",)

    speakers = 1  # its voices: one, or a speaker id per voice

    def speakable(self, text: str) -> bool:
        """Whether `text` holds anything this model speaks (its tokenizer drops the
        characters it does not know)."""
        return bool(text.strip())

    def speaker_of(self, voice: str) -> int:
        """The speaker id a voice names: OpenAI's names in order, or the id itself
        ("0", "1", ...); a one-speaker model speaks every voice with its one."""
        if self.speakers <= 1:
            return 0
        if voice.isdigit() and int(voice) < self.speakers:
            return int(voice)
        if voice in OPENAI_VOICES[: self.speakers]:
            return OPENAI_VOICES.index(voice)
        raise self._unknown_voice(voice)

    def voice_refused(self, voice: str) -> InvalidRequest | None:
        """Why this model cannot speak `voice` (None: it can, or it has one voice)."""
        try:
            self.speaker_of(voice)
        except InvalidRequest as exc:
            return exc
        return None

    def _unknown_voice(self, voice: str) -> InvalidRequest:
        names = ", ".join(OPENAI_VOICES[: self.speakers])
        return InvalidRequest(
            f"model {self.name!r} has {self.speakers} voices: {names} (or their speaker ids "
            f"0 to {self.speakers - 1}); it has no voice {voice!r}",
            param="voice",
        )

    def warmup_inputs(self) -> list[list[Utterance]]:
        return [[Utterance("warm up.")]]

    def probe_input(self) -> list[Utterance]:
        return [Utterance("ok")]


# What a model lacks, said when a route asks it for a capability it does not have.
LACKING: dict[type[ModelHandler], str] = {
    Embedder: "it has no embeddings",
    ImageModel: "it does not take images",
    Generator: "it does not generate text",
    Reranker: "it does not rerank (it is no cross-encoder)",
    ImageGenerator: "it does not generate images",
    Transcriber: "it does not transcribe audio",
    SpeechSynthesizer: "it does not speak text (it is no text-to-speech model)",
}
# A model's kind as a refusal says it: "model 'x' is an embedding model: ...".
KIND_PHRASES = {
    "embedding": "an embedding model",
    "generation": "a text generation model",
    "vision": "an image model",
    "rerank": "a reranking model",
    "diffusion": "an image generation model",
    "speech": "a speech recognition model",
    "speech_synthesis": "a text-to-speech model",
    "simulated": "a simulated model",
}


def kind_phrase(kind: str) -> str:
    return KIND_PHRASES.get(kind, f"a model of kind {kind!r}")


CAPABILITIES: tuple[type[ModelHandler], ...] = tuple(LACKING)
ONE_SHOT = frozenset(c for c in CAPABILITIES if issubclass(c, OneShotModel))
H = TypeVar("H", bound=ModelHandler)


def required(handler: ModelHandler, capability: type[H], name: str) -> H:
    """`handler` as the contract a route needs (`capability`); a model of another kind
    is a 400 that says what it lacks."""
    if not isinstance(handler, capability):
        raise WrongModelKind(
            f"model {name!r} is {kind_phrase(handler.kind)}: {LACKING[capability]}",
            param="model",
        )
    return handler
