"""The capability contracts: one per thing a model can do, checked by type.

- `Embedder`: texts or token ids → vectors (`/v1/embeddings`).
- `ImageModel`: encoded images → class scores or images (`/v1/models/{name}/predict`).
- `Generator`: a prompt or chat → text, token by token (`/v1/chat/completions`,
  `/v1/completions`).
- `Reranker`: (query, document) pairs → relevance scores (`/v1/rerank`).
- `ImageGenerator`: prompts → encoded images (`/v1/images/generations`).
- `Transcriber`: audio files → timed text (`/v1/audio/transcriptions`, `/translations`).

A one-shot model (embedder or image model) is split at the resource boundary:
`preprocess` runs on the CPU pool (tokenise or decode, bucket), `forward` on the
inference pool and is the only stage that holds device memory, `postprocess` on the CPU
pool again (or on the loop, when it is cheap). A handler inherits every contract it
fulfils (the simulated model fulfils all three); the registry checks at load that each
handler fulfils at least one, and the service asks for the one a route needs.
"""

from __future__ import annotations

import contextlib
import threading
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, Generic, TypeVar

import numpy as np

from app.config.settings import ModelSpec
from app.errors import InvalidImageSize, InvalidRequest
from app.models.audio import AudioClip
from app.models.base import Bucket, ModelHandler, Prepared
from app.models.decoding import DecodeResult, Prompt, SamplingParams, TokenStream
from app.models.image_buckets import group_of, is_tiled, merged, row_shape, rows_prepared
from app.models.image_prompt import ImageProgress, ImagePrompt
from app.sched.budget import Geometry

In = TypeVar("In")


class OneShotModel(ModelHandler, Generic[In]):
    """Inputs of type `In` in, one output row per input out, in one forward."""

    postprocess_on_loop = True  # False: postprocess runs on the CPU pool (heavy encoding)
    preprocess_on_loop = True  # False: never on the loop, however short (a runner's round trip)

    @abstractmethod
    def preprocess(self, inputs: list[In]) -> Prepared: ...

    @abstractmethod
    def forward(self, prepared: Prepared) -> Any: ...

    @abstractmethod
    def postprocess(self, raw: Any) -> Any:
        """One row per input, in the caller's order (an array, or a list)."""

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        """Several requests as one forward (continuous batching), or None if they cannot
        share one (too many inputs together). The rows of the result follow `parts`."""
        return parts[0] if len(parts) == 1 else None

    def batch_group(self, prepared: Prepared) -> str:
        """What requests must share to run in one forward, beyond their model ("": any
        may, as far as `merge` allows). Waiting requests are grouped by it, so that one
        of another shape between them does not keep them apart."""
        return ""

    @property
    def batchable(self) -> bool:
        return self.spec.max_batch > 1

    def prior_bytes(self, bucket: Bucket) -> int:
        """A declared or estimated cost before anything was measured (0: unknown)."""
        return 0

    def leaner(self, prepared: Prepared) -> Prepared | None:
        """The same work run in fewer bytes and more slowly (an image's VAE decoded in
        tiles), or None: there is no such way. The server runs it so when its full price
        cannot start now but this one can, or can never fit the device
        (app.core.scheduler.Scheduler.prefer)."""
        return None

    @abstractmethod
    def warmup_inputs(self) -> list[list[In]]:
        """Requests run once after loading so the common buckets have learned prices."""

    @abstractmethod
    def probe_input(self) -> list[In]:
        """The tiny real inference of the readiness check."""


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
    preprocess_on_loop = False  # decoding audio is never short enough for the loop
    postprocess_on_loop = False  # each window's tokens decoded to timed text

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
    """A prompt or a chat to text, decoded step by step into a TokenStream."""

    capability_names = ("completion", "tools")

    @abstractmethod
    def prepare_generation(
        self, prompt: Prompt, params: SamplingParams, default_max_tokens: int
    ) -> Prepared:
        """Tokenise a prompt or chat and bucket it (see app.models.decoding). CPU pool."""

    @abstractmethod
    def geometry(self, prompt_tokens: int) -> Geometry:
        """A generation's cost from the model's config, before any measurement: KV bytes
        per token and the prefill's activations for a prompt of `prompt_tokens`."""

    @abstractmethod
    def generate(self, prepared: Prepared, stream: TokenStream) -> DecodeResult:
        """Generate on the inference pool, emitting text to `stream` as it is decoded and
        stopping before the next step once `stream.cancelled` is set."""

    # A generator whose work runs elsewhere (a runner process) streams on the event loop
    # instead (`generate_on_loop`): no thread hop per token, whose CPU a runner sharing
    # a small machine's cores would lose.
    streams_on_loop = False

    async def generate_on_loop(self, prepared: Prepared, stream: TokenStream) -> DecodeResult:
        raise NotImplementedError("only where streams_on_loop is set")

    async def prepare_on_loop(
        self, prompt: Prompt, params: SamplingParams, default_max_tokens: int
    ) -> Prepared:
        """`prepare_generation` on the loop (where streams_on_loop is set): a runner
        tokenises, so preparing is waiting, not work for the CPU pool."""
        raise NotImplementedError("only where streams_on_loop is set")

    def warmup_prompts(self) -> list[str]:
        return ["Say hello."]

    def probe_prompt(self) -> str:
        return "ok"


# What a model lacks, said when a route asks it for a capability it does not have.
LACKING: dict[type[ModelHandler], str] = {
    Embedder: "it has no embeddings",
    ImageModel: "it does not take images",
    Generator: "it does not generate text",
    Reranker: "it does not rerank (it is no cross-encoder)",
    ImageGenerator: "it does not generate images",
    Transcriber: "it does not transcribe audio",
}
CAPABILITIES: tuple[type[ModelHandler], ...] = tuple(LACKING)
