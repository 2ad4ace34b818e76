"""A simulated model: declared bytes and run time per bucket, real accounting.

It really occupies its declared bytes on the device for its declared run time (on the
simulated device that is exact bookkeeping; on CPU or CUDA it is a real allocation),
and returns deterministic vectors. Faults can be injected on chosen calls.
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
from app.models.base import Bucket, ModelHandler, Prepared
from app.settings import ModelSpec, SimulatedBucket

DIMENSIONS = 64


class SimulatedHandler(ModelHandler):
    kind = "simulated"
    dimensions = DIMENSIONS

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self._buckets = sorted(spec.buckets, key=lambda b: b.size)
        self._by_label = {f"w{b.size}": b for b in self._buckets}
        self._lock = threading.Lock()  # guards forward_calls
        self._device: Device | None = None

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

    def preprocess(self, texts: list[str]) -> Prepared:
        words = sum(max(1, len(text.split())) for text in texts)
        declared = self._bucket_for(words)
        return Prepared(
            Bucket(f"w{declared.size}", declared.size),
            list(texts),
            words,
            count=len(texts),
            longest=words,
        )

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        """A batch costs what one request with all its words would."""
        if len(parts) == 1:
            return parts[0]
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

    def forward(self, prepared: Prepared) -> Any:
        assert self._device is not None, "load() first"
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
        declared = self._by_label[prepared.bucket.label]
        with self._device.hold(int(declared.bytes)):
            time.sleep(declared.run_ms / 1000)
        return prepared.payload

    def postprocess(self, raw: Any) -> np.ndarray:
        rows = []
        for text in raw:
            rng = np.random.default_rng(zlib.crc32(text.encode("utf-8")))
            row = rng.standard_normal(DIMENSIONS).astype(np.float32)
            rows.append(row / np.linalg.norm(row))
        return np.stack(rows)

    def warmup_inputs(self) -> list[list[str]]:
        return [[" ".join(["w"] * b.size)] for b in self._buckets]

    def prior_bytes(self, bucket: Bucket) -> int:
        declared = self._by_label.get(bucket.label)
        return int(declared.bytes) if declared else 0
