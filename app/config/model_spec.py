"""One model to serve, as the config file's `[[models]]` table (or `--model`) says it:
what it is and where, which engine runs it, and the knobs of its kind and engine. The
server's own settings are app.config.settings'."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from app.config.durations import keep_alive_seconds
from app.config.simulated_spec import (
    DEFAULT_SIMULATED_BUCKETS,
    FaultInjection,
    SimulatedBucket,
    SimulatedGeneration,
    SimulatedImages,
)

MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# a name a generation or embedding request may ask for: a served model's, or one that
# reaches one (`model_aliases`, Ollama's `NAME:latest` and `hf.co/ORG/NAME:QUANT`, an
# OpenAI fine-tune's `ft:...`); only ever looked up (app.core.fleet), never a path
REQUESTED_MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$"
_RESERVED = {"CON", "PRN", "AUX", "NUL"} | {f"{p}{i}" for p in ("COM", "LPT") for i in range(10)}


def is_reserved_name(name: str) -> bool:
    """Windows device names (CON, NUL, COM1...), with or without an extension."""
    return name.split(".")[0].upper() in _RESERVED


# the sampling defaults a generation model's config may set, by Ollama's names; `stop`'s
# bounds are a request's own (app.api.openai.schemas)
SAMPLING_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "stop")
MAX_STOP = 4  # stop sequences, in a config or a request (app.api.openai.schemas)
MAX_STOP_CHARS = 64

# a model's own device: one of the server's (cuda:1, simulated:0, cpu)
DEVICE_ID_PATTERN = r"^(cpu|cuda:\d{1,2}|simulated:\d{1,2})$"


# the kinds whose model is always a folder or file of its own (no embedded default)
PATH_KINDS = ("generation", "diffusion", "speech", "speech_synthesis")


class ModelSpec(BaseModel):
    """One model to serve. `kind` picks the handler; `path` None means the embedded model."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=MODEL_NAME_PATTERN)
    kind: Literal[
        "embedding",
        "generation",
        "vision",
        "rerank",
        "diffusion",
        "speech",
        "speech_synthesis",
        "simulated",
    ] = "embedding"
    path: Path | None = None  # a folder; for generation also a .gguf file
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    max_batch: int = Field(default=32, ge=1, le=1024)
    # generation: the tokens one request may hold (prompt and answer), `context_length`
    # too (None: the model's own trained context, on both engines)
    max_context: int | None = Field(
        default=None,
        ge=16,
        le=1_048_576,
        validation_alias=AliasChoices("max_context", "context_length"),
    )
    # generation: which engine runs it (auto: llama.cpp for a .gguf file where xllamacpp
    # is installed, else torch), and llama.cpp's own knobs
    engine: Literal["auto", "torch", "llama.cpp"] = "auto"
    # llama.cpp: a cap on the requests that run at once (None: as many as its KV cells
    # admit, up to its slots), and on the bytes its KV pool takes (None: sized from the
    # device at load, app.engines.llama_cpp.kv_pool)
    parallel: int | None = Field(default=None, ge=1, le=256)
    kv_budget: ByteSize | None = None
    kv_cache_type: Literal["f16", "q8_0", "q4_0"] = "f16"  # llama.cpp: KV cells' type
    flash_attention: Literal["auto", "on", "off"] = "auto"  # llama.cpp
    gpu_layers: int | Literal["auto"] = Field(default="auto")  # llama.cpp: auto = the gate's
    threads: int = Field(default=0, ge=0, le=512)  # llama.cpp: CPU threads (0: its default)
    # generation: keep ended streams' KV for prompts that begin the same way (torch: the
    # server's prefix cache; llama.cpp: its slots' prompt cache)
    prefix_cache: bool = True
    # llama.cpp: its host-RAM prompt cache, where idle slots' prompts go (None: a quarter
    # of the host RAM available at load, at most llama.cpp's own 8 GiB, at least one
    # request's KV; 0: off; on the CPU it is the device's memory, admitted at load)
    prompt_cache_ram: ByteSize | None = None
    # llama.cpp generation: draft-free speculative decoding (n-grams of its prompts and
    # answers drafted, verified in one step; app.engines.llama_cpp.speculation), on
    # unless false, governed by what it measures; a draft's fewest and most tokens
    # (None: the measured defaults)
    speculative: bool = True
    draft_min: int | None = Field(default=None, ge=0, le=256)
    draft_max: int | None = Field(default=None, ge=1, le=256)
    # generation: a chat past the context is refused (`error`) or answered with whole
    # turns dropped from its middle, said in a header and in usage (`truncate_middle`;
    # app.core.overflow); `auto`: truncated on Ollama's routes (as Ollama answers one),
    # refused on the others, whose clients act on the refusal (aider's advice through
    # litellm, Claude Code's compaction)
    context_overflow: Literal["auto", "error", "truncate_middle"] = "auto"
    # the class its requests queue in when they ask none (app.core.priority): a model
    # kept for batch work is `background`
    priority: Literal["priority", "interactive", "background"] = "interactive"
    # embedding: the widths its vectors may be cut to (Matryoshka), where its own config
    # (`matryoshka_dimensions` in config.json) does not say so
    matryoshka_dimensions: tuple[int, ...] = ()
    keep_alive: float | None = None  # how long it stays loaded idle (None: the setting's)
    # when it loads: at start, or on its first request (None: the first model configured
    # at start, the others on demand)
    load: Literal["startup", "demand"] | None = None
    # vision: what the model returns, and (for a weights file) its torchvision architecture
    output: Literal["classes", "image"] = "classes"
    arch: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_]{0,63}$")
    # diffusion, a single-file checkpoint: a diffusers folder holding its pipeline's
    # configs (model_index.json and each component's), so nothing is fetched
    pipeline_config: Path | None = None
    # generation: sampling defaults a request takes where it leaves them out, on every
    # API (Ollama's Modelfile PARAMETER and SYSTEM; app.api.intake applies them)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=1_000_000)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    stop: tuple[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)], ...] = Field(
        default=(), max_length=MAX_STOP
    )
    system: str | None = Field(default=None, min_length=1, max_length=100_000)
    # generation, a reasoning model: the most tokens it thinks before its answer where a
    # request sets no budget (None: unbounded; app.models.chat.reasoning)
    thinking_budget: int | None = Field(default=None, ge=0, le=1_048_576)
    # where `vramgate pull` took it from, when that was the Hugging Face Hub
    # (`hf:ORG/NAME:QUANT`, the quantisation fetched): Ollama's spelling of that source,
    # `hf.co/ORG/NAME:QUANT` (any case), names this model too, as Ollama's clients name a
    # model after `ollama pull hf.co/...` (app.core.fleet.names)
    pulled_from: str | None = Field(default=None, max_length=300)
    # where it runs, of the server's devices (None: where it fits with the most room),
    # and on how many devices a copy of it serves (requests go where they fit soonest)
    device: str | None = Field(default=None, pattern=DEVICE_ID_PATTERN)
    replicas: int = Field(default=1, ge=1, le=16)

    buckets: tuple[SimulatedBucket, ...] = DEFAULT_SIMULATED_BUCKETS  # simulated only
    load_ms: float = Field(default=0, ge=0, le=600_000)  # simulated only: declared load time
    weights: ByteSize = ByteSize(0)  # simulated only: bytes its weights hold while loaded
    inject: FaultInjection = FaultInjection()  # simulated only
    # simulated only: generation priced by its KV bytes (None: by the words buckets)
    generation: SimulatedGeneration | None = None
    # simulated only: an image generator instead (app.engines.simulated.images)
    images: SimulatedImages | None = None

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _keep_alive(cls, value: object) -> float | None:
        return None if value is None else keep_alive_seconds(value)

    @field_validator("name")
    @classmethod
    def _not_a_device_name(cls, value: str) -> str:
        if is_reserved_name(value):
            raise ValueError(f"{value!r} is a reserved device name on Windows")
        return value

    @model_validator(mode="after")
    def _generation_needs_a_path(self) -> ModelSpec:

        if self.kind in PATH_KINDS and self.path is None:
            raise ValueError(f"model {self.name!r}: a {self.kind} model needs a path")
        return self

    def sampling_defaults(self) -> dict[str, Any]:
        """Its sampling defaults that the config sets, by Ollama's names (`options`)."""
        found = {name: getattr(self, name) for name in SAMPLING_DEFAULTS}
        return {name: value for name, value in found.items() if value not in (None, ())}

    def request_defaults(self) -> dict[str, Any]:
        """What a request that leaves them out takes: its sampling defaults, its system
        prompt (as /v1/models shows them)."""
        system = {"system": self.system} if self.system else {}
        return {**self.sampling_defaults(), **system}

    @classmethod
    def parse_cli(cls, text: str) -> ModelSpec:
        """`NAME=KIND` or `NAME=KIND:PATH`, e.g. `sim=simulated`, `bge=embedding:/models/bge`."""
        name, sep, rest = text.partition("=")
        if not sep:
            raise ValueError(f"model spec {text!r} is not NAME=KIND[:PATH]")
        kind, _, path = rest.partition(":")
        return cls(name=name, kind=kind, path=Path(path) if path else None)  # type: ignore[arg-type]
