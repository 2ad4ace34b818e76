"""A simulated model: declared bytes and run time per bucket, real accounting.

It really occupies its declared bytes on the device for its declared run time (on the
simulated device that is exact bookkeeping; on CPU or CUDA it is a real allocation),
and returns deterministic vectors. It also generates text (words as tokens, one bucket
run_ms per step), so streams can be tested on a simulated pool. Faults can be injected
on chosen calls.
"""

from __future__ import annotations

import threading
import time
import zlib
from typing import Any

import numpy as np
import torch

from app.engine.device import Device
from app.errors import InvalidRequest
from app.models.base import Bucket, ModelHandler, Prepared, Prompt
from app.models.images import encode_png, image_size
from app.models.textgen import (
    GenerationInput,
    GenerationOutcome,
    SamplingParams,
    StopScanner,
    TokenStream,
    generation_prepared,
)
from app.settings import ModelSpec, SimulatedBucket

DIMENSIONS = 64


def _unit_vectors(count: int) -> np.ndarray:
    rows = np.random.default_rng(0).standard_normal((count, DIMENSIONS)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


_VECTORS = _unit_vectors(4096)


class SimulatedHandler(ModelHandler):
    kind = "simulated"
    dimensions = DIMENSIONS
    generates = True  # and embeds, and takes images
    sees = True
    max_side, max_pixels = 4096, 2**24  # image bounds; the registry sets the configured ones

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self._buckets = sorted(spec.buckets, key=lambda b: b.size)
        self._by_label = {f"w{b.size}": b for b in self._buckets}
        self._lock = threading.Lock()  # guards forward_calls
        self._device: Device | None = None
        self._leaked: list[bytearray] = []  # what an injected leak keeps

    def load(self, device: Device) -> None:
        time.sleep(self.spec.load_ms / 1000)
        self._device = device

    def _bucket_for(self, words: int) -> SimulatedBucket:
        for bucket in self._buckets:
            if words <= bucket.size:
                return bucket
        largest = self._buckets[-1].size
        raise InvalidRequest(
            f"input has {words} words; model {self.name!r} accepts at most {largest}",
            param="input",
        )

    def preprocess(self, texts: list[Any]) -> Prepared:
        if texts and isinstance(texts[0], bytes):
            return self._preprocess_images(texts)
        words = sum(max(1, len(text.split())) for text in texts)
        declared = self._bucket_for(words)
        return Prepared(
            Bucket(f"w{declared.size}", declared.size),
            list(texts),
            words,
            count=len(texts),
            longest=words,
        )

    def _preprocess_images(self, images: list[Any]) -> Prepared:
        """Images: the bucket is the one whose size covers the longest side."""
        if not all(isinstance(item, bytes) for item in images):
            raise InvalidRequest("send images or texts, not both", param="input")
        sides = [max(image_size(data, self.max_side, self.max_pixels)) for data in images]
        declared = self._bucket_for(max(sides))
        return Prepared(
            Bucket(f"w{declared.size}", declared.size),
            list(images),
            max(sides),
            count=len(images),
            longest=max(sides),
        )

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        """A batch costs what one request with all its words would (images: no batches)."""
        if len(parts) == 1:
            return parts[0]
        if any(isinstance(p.payload[0], bytes) for p in parts):
            return None
        words = sum(p.tokens for p in parts)
        texts = [text for p in parts for text in p.payload]
        if words > self._buckets[-1].size or len(texts) > self.spec.max_batch:
            return None
        declared = self._bucket_for(words)
        return Prepared(
            Bucket(f"w{declared.size}", declared.size),
            texts,
            words,
            count=len(texts),
            longest=words,
        )

    def _call(self) -> None:
        """Count a forward call (a generation step is one) and inject its fault, if any."""
        with self._lock:
            self.forward_calls += 1
            call = self.forward_calls
        inject = self.spec.inject
        if call in inject.oom_on_calls:
            raise torch.OutOfMemoryError(f"injected out-of-memory on call {call}")
        if call in inject.fatal_on_calls:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (injected)")
        if call in inject.error_on_calls:
            raise ValueError(f"injected handler error on call {call}")
        if call in inject.hang_on_calls:
            time.sleep(inject.hang_ms / 1000)
        if inject.leak_bytes_per_call:
            self._leaked.append(bytearray(b"\x5a") * int(inject.leak_bytes_per_call))  # touched

    def forward(self, prepared: Prepared) -> Any:
        assert self._device is not None, "load() first"
        self._call()
        declared = self._by_label[prepared.bucket.label]
        with self._device.hold(int(declared.bytes)):
            time.sleep(declared.run_ms / 1000)
        return prepared.payload

    # -- generation: words are tokens; a bucket's run_ms is the time of one step -----------
    def prepare_generation(
        self, prompt: Prompt, params: SamplingParams, default_max_tokens: int
    ) -> Prepared:
        if isinstance(prompt, str):
            text = prompt
        else:
            text = " ".join(message.get("content") or "" for message in prompt)
        ids = [zlib.crc32(word.encode("utf-8")) for word in text.split()]
        context = self._buckets[-1].size
        plain = generation_prepared(self.name, ids, params, context, default_max_tokens)
        task: GenerationInput = plain.payload
        # Priced like an embedding of as many words as the whole generation may hold.
        declared = self._bucket_for(len(ids) + task.max_tokens)
        return Prepared(
            Bucket(f"w{declared.size}", declared.size), task, len(ids), longest=len(ids)
        )

    def generate(self, prepared: Prepared, stream: TokenStream) -> GenerationOutcome:
        assert self._device is not None, "load() first"
        task: GenerationInput = prepared.payload
        seed = task.params.seed
        rng = np.random.default_rng(seed if seed is not None else sum(task.prompt_ids))
        declared = self._by_label[prepared.bucket.label]
        scanner = StopScanner(task.params.stop)
        text, produced, steps, finish = "", 0, 0, "length"
        with self._device.hold(int(declared.bytes)):
            for _ in range(task.max_tokens):
                if stream.cancelled.is_set():
                    finish = "cancelled"
                    break
                self._call()
                steps += 1
                time.sleep(declared.run_ms / 1000)
                text += f"w{int(rng.integers(1000))} "
                produced += 1
                stream.emit(scanner.push(text))
                if scanner.stopped:
                    finish = "stop"
                    break
        if not scanner.stopped:
            stream.emit(scanner.push(text, final=True))
        return GenerationOutcome(scanner.text, len(task.prompt_ids), produced, finish, steps)

    def postprocess(self, raw: Any) -> np.ndarray:
        """One unit vector per input, picked by the input's CRC-32 from a fixed table:
        the same input always gets the same vector, at a table lookup's cost."""
        picks = [zlib.crc32(item if isinstance(item, bytes) else item.encode()) for item in raw]
        return _VECTORS[np.array(picks, dtype=np.uint32) % len(_VECTORS)]

    def warmup_images(self) -> list[bytes]:
        return [encode_png(np.zeros((16, 16, 3), dtype=np.uint8))]

    def warmup_inputs(self) -> list[list[str]]:
        return [[" ".join(["w"] * b.size)] for b in self._buckets]

    def prior_bytes(self, bucket: Bucket) -> int:
        declared = self._by_label.get(bucket.label)
        return int(declared.bytes) if declared else 0
