"""What a simulated model is told to be (part of its ModelSpec): its declared buckets,
how it generates, and the faults it raises. The simulated device and model are ordinary
config choices for tests and demos (app.engines.simulated.model)."""

from __future__ import annotations

from pydantic import BaseModel, ByteSize, ConfigDict, Field, model_validator


class SimulatedBucket(BaseModel):
    """One declared bucket of the simulated model: inputs up to `size` words are declared
    to cost `bytes` (the server's prior guess). What a run really allocates is
    `true_bytes` (default: `bytes`), which the server does not know in advance and must
    measure; `warm = false` leaves the bucket out of the warm-up; `steps` > 1: a run is
    that many steps of `run_ms` / steps each, reported as they end (a job of many steps,
    as a long audio's windows or a diffusion's denoising: the watchdog sees it live)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    size: int = Field(ge=1, le=1_000_000)
    bytes: ByteSize
    run_ms: float = Field(ge=0, le=600_000)
    true_bytes: ByteSize | None = None
    warm: bool = True
    steps: int = Field(default=1, ge=1, le=100_000)


class SimulatedGeneration(BaseModel):
    """How the simulated model generates. Its "config" declares `kv_bytes_per_token` and
    `fixed_bytes` (the geometry the server prices from; 0: unknown); it really allocates
    `true_fixed_bytes` plus `true_kv_bytes_per_token` per token its cache holds, growing
    step by step, after a prefill of `prefill_ms_per_token` for each prompt token it did
    not find cached. With `answer_tokens` (lo, hi), answers end at a length drawn from that
    range (seeded by the prompt), as real chats end at end-of-sequence."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kv_bytes_per_token: ByteSize = ByteSize(0)
    fixed_bytes: ByteSize = ByteSize(0)
    true_kv_bytes_per_token: ByteSize = ByteSize(0)
    true_fixed_bytes: ByteSize = ByteSize(0)
    step_ms: float = Field(default=5, ge=0, le=60_000)
    # the prefill's time for each prompt token not found in the prefix cache, before the
    # first step (a real model's long prompt keeps its first token waiting)
    prefill_ms_per_token: float = Field(default=0, ge=0, le=10_000)
    answer_tokens: tuple[int, int] | None = None

    @model_validator(mode="after")
    def _range(self) -> SimulatedGeneration:
        if (
            self.answer_tokens is not None
            and not 1 <= self.answer_tokens[0] <= self.answer_tokens[1]
        ):
            raise ValueError("answer_tokens is (lo, hi) with 1 <= lo <= hi")
        return self


class SimulatedImages(BaseModel):
    """A simulated text-to-image model (app.engines.simulated.images): it answers
    /v1/images/generations with images of the asked size. An image of P pixels declares
    `bytes_per_pixel` × P (the geometry it is first quoted by) and really holds
    `true_bytes_per_pixel` × P (default: as declared; the server must measure it) plus
    the fault injection's jitter, for `steps` steps of `step_ms` per megapixel each. A
    run whose VAE decode is tiled holds a `tile`² tile's decode, but never less than the
    denoising's `denoise_share` of the full image's bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    bytes_per_pixel: float = Field(default=2000, gt=0, le=1e6)
    true_bytes_per_pixel: float | None = Field(default=None, gt=0, le=1e6)
    tile: int = Field(default=512, ge=64, le=4096)
    denoise_share: float = Field(default=0.25, gt=0, le=1)
    steps: int = Field(default=4, ge=1, le=1000)
    step_ms: float = Field(default=5, ge=0, le=60_000)
    default_size: int = Field(default=512, ge=64, le=4096)


DEFAULT_SIMULATED_BUCKETS: tuple[SimulatedBucket, ...] = (
    SimulatedBucket(size=16, bytes=ByteSize(50 * 2**20), run_ms=20),
    SimulatedBucket(size=64, bytes=ByteSize(200 * 2**20), run_ms=40),
    SimulatedBucket(size=256, bytes=ByteSize(600 * 2**20), run_ms=80),
    SimulatedBucket(size=1024, bytes=ByteSize(1536 * 2**20), run_ms=160),
)


class FaultInjection(BaseModel):
    """Faults the simulated model raises on its k-th forward call (1-based), for tests."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    oom_on_calls: tuple[int, ...] = ()
    fatal_on_calls: tuple[int, ...] = ()
    error_on_calls: tuple[int, ...] = ()
    hang_on_calls: tuple[int, ...] = ()  # the call blocks for hang_ms (a wedged thread)
    hang_ms: float = Field(default=0, ge=0, le=3_600_000)
    leak_bytes_per_call: ByteSize = ByteSize(0)  # a leaking handler (the soak's control)
    # each run really allocates its bucket's true bytes × (1 + a uniform draw in [0, this])
    true_jitter: float = Field(default=0.0, ge=0, le=10)
