"""The model handler interface, split at the resource boundary.

`preprocess` runs on the CPU pool (tokenise, bucket), `forward` on the inference pool
and is the only stage that holds device memory, `postprocess` on the CPU pool again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from app.engine.device import Device
from app.errors import WrongModelKind
from app.settings import ModelSpec

if TYPE_CHECKING:
    from app.models.textgen import GenerationOutcome, SamplingParams, TokenStream

Prompt = str | list[dict[str, str]]  # a completion's text, or chat messages (role, content)


@dataclass(frozen=True)
class Bucket:
    """A size class of jobs that cost about the same; `size` orders buckets of a model."""

    label: str
    size: int


@dataclass(frozen=True)
class Prepared:
    """A preprocessed request: what `forward` needs, its bucket, its token count, how
    many inputs it holds, and the length of its longest input (tokens or words)."""

    bucket: Bucket
    payload: Any
    tokens: int
    count: int = 1
    longest: int = 0


def next_pow2(value: int, floor: int = 1) -> int:
    size = max(floor, 1)
    while size < value:
        size *= 2
    return size


class ModelHandler(ABC):
    kind: str
    dimensions: int
    embeds = True  # serves /v1/embeddings (preprocess → forward → postprocess)
    generates = False  # serves /v1/chat/completions and /v1/completions
    sees = False  # serves /v1/models/{name}/predict with images (bytes) as inputs
    postprocess_on_loop = True  # False: postprocess runs on the CPU pool (heavy encoding)

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.dtype = "float32"
        self.forward_calls = 0  # written by the inference threads; read for /status

    @abstractmethod
    def load(self, device: Device) -> None:
        """Load weights onto `device`. Runs once, in a background thread."""

    def torch_module(self) -> Any:
        """The loaded torch module (None when unloaded, or for a simulated model)."""
        return None

    def weights_bytes(self) -> int:
        """Bytes of the loaded weights (parameters and buffers); 0 when unloaded."""
        module = self.torch_module()
        if module is None:
            return 0
        tensors = [*module.parameters(), *module.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def unload(self) -> None:
        """Drop the weights; `load` may be called again later."""
        return None

    @abstractmethod
    def preprocess(self, texts: list[str]) -> Prepared: ...

    @abstractmethod
    def forward(self, prepared: Prepared) -> Any: ...

    @abstractmethod
    def postprocess(self, raw: Any) -> np.ndarray:
        """Float32 array, one row per input, in the caller's order."""

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        """Several requests as one forward (continuous batching), or None if they cannot
        share one (too many inputs together). The rows of the result follow `parts`."""
        return parts[0] if len(parts) == 1 else None

    @property
    def batchable(self) -> bool:
        return self.spec.max_batch > 1

    def prime(self) -> None:
        """One unmeasured forward right after loading, so one-time lazy allocations
        (kernels, thread pools) land in the weights baseline and not in a bucket's price."""
        return None

    def warmup_inputs(self) -> list[list[str]]:
        """Requests run once after loading so the common buckets have learned prices."""
        return [["warm up"]]

    def warmup_images(self) -> list[bytes]:
        """An image model's warm-up and probe input (encoded images)."""
        return []

    def probe_input(self) -> list[str]:
        """The tiny real inference of the readiness check."""
        return ["ok"]

    def prepare_generation(
        self, prompt: Prompt, params: SamplingParams, default_max_tokens: int
    ) -> Prepared:
        """Tokenise a prompt or chat and bucket it (see app.models.textgen). CPU pool."""
        raise WrongModelKind(f"model {self.name!r} does not generate text", param="model")

    def generate(self, prepared: Prepared, stream: TokenStream) -> GenerationOutcome:
        """Generate on the inference pool, emitting text to `stream` as it is decoded and
        stopping before the next step once `stream.cancelled` is set."""
        raise WrongModelKind(f"model {self.name!r} does not generate text", param="model")

    def prior_bytes(self, bucket: Bucket) -> int:
        """A declared or estimated cost before anything was measured (0: unknown)."""
        return 0

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "dtype": self.dtype,
            "dimensions": self.dimensions,
            "max_batch": self.spec.max_batch,
            "forward_calls": self.forward_calls,
        }
