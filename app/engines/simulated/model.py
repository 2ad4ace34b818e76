"""A simulated model: declared costs the server may read, true costs it must measure.

Each bucket declares its bytes (the server's prior guess) and really occupies its *true*
bytes (`true_bytes`, maybe with a random jitter per run) on the device for its run time
(on the simulated device that is exact bookkeeping, and over-commitment raises torch's
OutOfMemoryError; on CPU or CUDA it is a real allocation), and returns deterministic
vectors. It also generates text (words as tokens): with a `generation` setting its "config"
declares a KV geometry while it really holds its true fixed bytes plus true bytes per token
its cache holds, growing step by step, and its answers may end early at random lengths;
without one, a generation holds its words bucket's bytes for `run_ms` per step. Faults
can be injected on chosen calls.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import zlib
from typing import Any

import numpy as np
import torch

from app.config.settings import ModelSpec, SimulatedBucket
from app.devices.base import Device
from app.errors import InvalidRequest
from app.models.decoding import (
    DecodeResult,
    GenerationInput,
    Prompt,
    SamplingParams,
    StopScanner,
    TokenStream,
    generation_prepared,
)
from app.models.images import encode_png, image_size
from app.models.kinds import Embedder, Generator, ImageModel
from app.models.prefix_cache import MIN_CACHED, Entry
from app.models.prepared import Bucket, Prepared
from app.models.stages import InThreads
from app.sched.budget import Geometry

DIMENSIONS = 64


def _unit_vectors(count: int) -> np.ndarray:
    rows = np.random.default_rng(0).standard_normal((count, DIMENSIONS)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


_VECTORS = _unit_vectors(4096)


class TrueJitter:
    """The fault injection's jitter on a run's true bytes: × (1 + U(0, `true_jitter`)),
    drawn from a generator seeded by the model's name (runs repeat), under its own lock
    (inference threads draw at once)."""

    def __init__(self, spec: ModelSpec) -> None:
        self._amount = spec.inject.true_jitter
        self._draws = random.Random(zlib.crc32(spec.name.encode()))
        self._lock = threading.Lock()

    def __call__(self, true: int) -> int:
        if not self._amount:
            return true
        with self._lock:
            return int(true * (1 + self._draws.uniform(0, self._amount)))


class SimulatedWeights:
    """A simulated model's weights: the spec's `weights` bytes held on the device from its
    load (which takes `load_ms`) to its unload; it has no torch module to count. As a real
    load moves layer after layer to the device, half arrives at once and the rest after
    `load_ms`: memory another program takes meanwhile can leave the second half no room
    (the out-of-memory is the device's own), with the first half already held."""

    spec: ModelSpec
    _device: Device | None = None
    _weights: contextlib.ExitStack | None = None

    def expected_weights_bytes(self, device: Device) -> int:
        return int(self.spec.weights)

    def load(self, device: Device) -> None:
        self._weights = contextlib.ExitStack()  # the weights stay on the device until unload
        first = int(self.spec.weights) // 2
        self._weights.enter_context(device.hold(first))
        time.sleep(self.spec.load_ms / 1000)
        self._weights.enter_context(device.hold(int(self.spec.weights) - first))
        self._device = device

    def unload(self) -> None:
        """Its weights off the device: all of them, or what a load cut short had moved."""
        if self._weights is not None:
            self._weights.close()
            self._weights = None
        self._device = None

    def weights_bytes(self) -> int:
        return int(self.spec.weights) if self._device is not None else 0


class SimulatedHandler(InThreads, SimulatedWeights, Embedder, ImageModel, Generator):  # type: ignore[misc]
    """Fakes every capability: texts, images (bytes) and prompts all come in."""

    kind = "simulated"
    engine = "simulated"
    dimensions = DIMENSIONS
    max_side, max_pixels = 4096, 2**24  # image bounds; the registry sets the configured ones

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self._buckets = sorted(spec.buckets, key=lambda b: b.size)
        self._by_label = {f"w{b.size}": b for b in self._buckets}
        self._lock = threading.Lock()  # guards forward_calls
        self._jitter = TrueJitter(spec)
        self._leaked: list[bytearray] = []  # what an injected leak keeps

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
        words = sum(max(1, len(t.split() if isinstance(t, str) else t)) for t in texts)
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

    def true_bytes(self, bucket: SimulatedBucket) -> int:
        """What one run of `bucket` really allocates: unknown to the server in advance."""
        return self._jitter(
            int(bucket.true_bytes if bucket.true_bytes is not None else bucket.bytes)
        )

    def forward(self, prepared: Prepared) -> Any:
        assert self._device is not None, "load() first"
        self._call()
        declared = self._by_label[prepared.bucket.label]
        with self._device.hold(self.true_bytes(declared)):
            for _ in range(declared.steps):
                time.sleep(declared.run_ms / declared.steps / 1000)
                if declared.steps > 1:
                    self.progress_at = time.monotonic()  # a step ended: the watchdog sees it
        return prepared.payload

    # -- generation: words are tokens ------------------------------------------------------
    def prepare_generation(
        self, prompt: Prompt, params: SamplingParams, default_max_tokens: int
    ) -> Prepared:
        if isinstance(prompt, str):
            text = prompt
        else:
            text = " ".join(message.get("content") or "" for message in prompt.messages)
        ids = [zlib.crc32(word.encode("utf-8")) for word in text.split()]
        context = self._buckets[-1].size
        prepared = generation_prepared(self.name, ids, params, context, default_max_tokens)
        if self.spec.generation is not None:  # priced by its KV bytes, as a real model
            return prepared
        # Without a generation setting it holds its words bucket's bytes from the first
        # step to the last, whatever its length: priced as that bucket, like a batch.
        task: GenerationInput = prepared.payload
        declared = self._bucket_for(len(ids) + task.max_tokens)
        return Prepared(
            Bucket(f"w{declared.size}", declared.size), task, len(ids), longest=len(ids)
        )

    def geometry(self, prompt_tokens: int) -> Geometry:
        gen = self.spec.generation
        if gen is None:
            return Geometry(0, 0)
        return Geometry(int(gen.kv_bytes_per_token), int(gen.fixed_bytes))

    def generate(self, prepared: Prepared, stream: TokenStream) -> DecodeResult:
        assert self._device is not None, "load() first"
        task: GenerationInput = prepared.payload
        seed = task.params.seed
        rng = np.random.default_rng(seed if seed is not None else sum(task.prompt_ids))
        gen = self.spec.generation
        prompt = len(task.prompt_ids)
        if gen is None:  # the words bucket's bytes for the whole generation
            declared = self._bucket_for(prompt + task.max_tokens)
            held, per_token, step_ms = self.true_bytes(declared), 0, declared.run_ms
        else:
            held = int(gen.true_fixed_bytes) + int(gen.true_kv_bytes_per_token) * prompt
            per_token, step_ms = int(gen.true_kv_bytes_per_token), gen.step_ms
        cached = self._cached_prefix(task)
        answer = task.max_tokens
        if gen is not None and gen.answer_tokens is not None:
            answer = int(rng.integers(gen.answer_tokens[0], gen.answer_tokens[1] + 1))
        scanner = StopScanner(task.params.stop)
        text, produced, steps, finish = "", 0, 0, "length"
        with contextlib.ExitStack() as memory:
            fixed = int(gen.true_fixed_bytes) if gen is not None else held
            memory.enter_context(self._device.hold(fixed))  # the prefill's activations
            before_cache = self._device.held_by_this_thread()
            memory.enter_context(self._device.hold(held - fixed))  # the prompt's cache
            if gen is not None:
                self._prefill((prompt - cached) * gen.prefill_ms_per_token / 1000, stream)
            for _ in range(task.max_tokens):
                if stream.cancelled.is_set():
                    finish = "cancelled"
                    break
                self._call()
                if steps and per_token:  # the previous token joins the cache
                    memory.enter_context(self._device.hold(per_token))
                steps += 1
                time.sleep(step_ms / 1000)
                if produced == answer:  # end of sequence
                    finish = "stop"
                    break
                text += f"w{int(rng.integers(1000))} "
                produced += 1
                stream.emit(scanner.push(text))
                if scanner.stopped:
                    finish = "stop"
                    break
            cache_bytes = self._device.held_by_this_thread() - before_cache
        if not scanner.stopped:
            stream.emit(scanner.push(text, final=True))
        kv_tokens = prompt + max(0, steps - 1) if steps else 0
        if gen is not None and finish != "cancelled":
            fed = [zlib.crc32(word.encode("utf-8")) for word in text.split()][: kv_tokens - prompt]
            self._keep(task, [*task.prompt_ids, *fed], int(gen.true_kv_bytes_per_token))
        return DecodeResult(
            scanner.text,
            prompt,
            produced,
            finish,
            steps,
            kv_tokens=kv_tokens,
            # its cache as the device held it (a real model's is read off its tensors),
            # not the model's own arithmetic
            kv_bytes=cache_bytes if per_token else 0,
            stop_sequence=scanner.matched,
            cached_tokens=cached,
        )

    @staticmethod
    def _prefill(seconds: float, stream: TokenStream) -> None:
        """The prefill's time, alive (a beat every 50 ms) and stopped by a cancel."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and not stream.cancelled.is_set():
            time.sleep(min(left, 0.05))
            stream.beat()

    def _cached_prefix(self, task: GenerationInput) -> int:
        """The prompt tokens a kept prefix holds (a real model would not prefill them)."""
        store = self.prefix_store
        if store is None or not task.params.prefix_cache or self.spec.generation is None:
            return 0
        return store.longest(self.name, task.prompt_ids, scope=task.params.cache_scope)[1]

    def _keep(self, task: GenerationInput, ids: list[int], per_token: int) -> None:
        """An ended generation's KV (as the device holds it: its true bytes per token)
        stays in the prefix cache, where the simulated device and the store have room."""
        store, device = self.prefix_store, self._device
        keep = getattr(device, "keep", None)
        if store is None or keep is None or not task.params.prefix_cache or len(ids) < MIN_CACHED:
            return
        scope = task.params.cache_scope
        if store.covers(self.name, ids, scope):
            return
        release = keep(per_token * len(ids))
        if release is not None:
            nbytes = per_token * len(ids)
            store.put(Entry(self.name, tuple(ids), nbytes, None, release, scope=scope))

    def postprocess(self, raw: Any) -> np.ndarray:
        """One unit vector per input, picked by the input's CRC-32 from a fixed table:
        the same input always gets the same vector, at a table lookup's cost."""
        picks = [zlib.crc32(_bytes_of(item)) for item in raw]
        return _VECTORS[np.array(picks, dtype=np.uint32) % len(_VECTORS)]

    def warmup_image(self) -> bytes:
        return encode_png(np.zeros((16, 16, 3), dtype=np.uint8))

    def warmup_inputs(self) -> list[list[Any]]:  # texts: it warms up as an embedder
        return [[" ".join(["w"] * b.size)] for b in self._buckets if b.warm]

    def prior_bytes(self, bucket: Bucket) -> int:
        declared = self._by_label.get(bucket.label)
        return int(declared.bytes) if declared else 0


def _bytes_of(item: bytes | str | list[int]) -> bytes:
    """An input's bytes: an image's own, a text's UTF-8, token ids' decimal text."""
    if isinstance(item, bytes):
        return item
    return (item if isinstance(item, str) else " ".join(map(str, item))).encode()
