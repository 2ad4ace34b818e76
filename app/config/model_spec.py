"""One model to serve, as the config file's `[[models]]` table (or `--model`) says it:
what it is and where, which engine runs it, and the knobs of its kind and engine. The
server's own settings are app.config.settings'."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    PrivateAttr,
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
    # each field's description is its line in docs/settings-reference.md (app.config.reference)
    name: str = Field(
        pattern=MODEL_NAME_PATTERN,
        description="the name requests ask for (letters, digits, `.`, `_`, `-`; 64 at most)",
    )
    kind: Literal[
        "embedding",
        "generation",
        "vision",
        "rerank",
        "diffusion",
        "speech",
        "speech_synthesis",
        "simulated",
    ] = Field("embedding", description="what the model does, and so which handler serves it")
    path: Path | None = Field(
        None,
        description="its folder, or for generation a .gguf file (none: the embedded model)",
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="the torch engine's weights' type (auto: chosen for the device)"
    )
    max_batch: int = Field(
        default=32, ge=1, le=1024, description="inputs (or images, windows) in one batch"
    )
    max_context: int | None = Field(
        default=None,
        ge=16,
        le=1_048_576,
        validation_alias=AliasChoices("max_context", "context_length"),
        description="generation: the tokens one request may hold, prompt and answer, also "
        "spelled `context_length` (none: the model's own trained context, on both engines)",
    )
    engine: Literal["auto", "torch", "llama.cpp"] = Field(
        "auto",
        description="generation: which engine runs it (auto: llama.cpp for a .gguf file "
        "where xllamacpp is installed, else torch)",
    )
    parallel: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="llama.cpp: a cap on the requests that run at once (none: as many as "
        "its KV cells admit, up to its slots)",
    )
    kv_budget: ByteSize | None = Field(
        None,
        description="llama.cpp: a cap on the bytes its KV pool takes (none: sized from the "
        "device at load)",
    )
    kv_cache_type: Literal["f16", "q8_0", "q4_0"] = Field(
        "f16", description="llama.cpp: the type of its KV cells"
    )
    flash_attention: Literal["auto", "on", "off"] = Field(
        "auto", description="llama.cpp: flash attention"
    )
    gpu_layers: int | Literal["auto"] = Field(
        default="auto",
        description="llama.cpp: layers on the GPU (auto: as many as the gate finds room for)",
    )
    threads: int = Field(
        default=0, ge=0, le=512, description="llama.cpp: CPU threads (0: its default)"
    )
    prefix_cache: bool = Field(
        True,
        description="generation: keep ended streams' KV for prompts that begin the same way "
        "(torch: the server's prefix cache; llama.cpp: its slots' prompt cache)",
    )
    prompt_cache_ram: ByteSize | None = Field(
        None,
        description="llama.cpp: its host-RAM prompt cache, where idle slots' prompts go "
        "(none: a quarter of the host RAM available at load, at most llama.cpp's own 8 GiB, "
        "at least one request's KV; 0: off; on the CPU it is the device's memory, admitted "
        "at load)",
    )
    speculative: bool = Field(
        True,
        description="llama.cpp generation: speculative decoding (n-grams of its prompts and "
        "answers drafted, or the draft model `draft` names, verified in one step), on unless "
        "false, turned off by itself where it measures that it does not pay",
    )
    draft_min: int | None = Field(
        default=None,
        ge=0,
        le=256,
        description="speculative decoding: a draft's fewest tokens (none: the measured "
        "default; with a draft model, llama.cpp's own, 0)",
    )
    draft_max: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="speculative decoding: a draft's most tokens (none: the measured "
        "default; with a draft model, llama.cpp's own, 3)",
    )
    draft: str | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="llama.cpp generation: a draft model for speculative decoding, in place "
        "of the n-gram drafts: the name of another GGUF generation model of this config, or "
        "a .gguf file; its vocabulary must be the model's own (a smaller model of the same "
        "family); its weights, KV and buffers are counted in the model's bytes",
    )
    context_overflow: Literal["auto", "error", "truncate_middle"] = Field(
        "auto",
        description="generation: a chat past the context is refused (`error`) or answered "
        "with whole turns dropped from its middle, said in a header and in usage "
        "(`truncate_middle`); `auto`: truncated on Ollama's routes (as Ollama answers one), "
        "refused on the others, whose clients act on the refusal",
    )
    priority: Literal["priority", "interactive", "background"] = Field(
        "interactive",
        description="the class its requests queue in when they ask none (a model kept for "
        "batch work is `background`)",
    )
    matryoshka_dimensions: tuple[int, ...] = Field(
        (),
        description="embedding: the widths its vectors may be cut to (Matryoshka), where its "
        "own config.json does not say so",
    )
    keep_alive: float | None = Field(
        None,
        description="how long it stays loaded idle: seconds, `5m`, `0`, `-1` (none: the setting's)",
    )
    load: Literal["startup", "demand"] | None = Field(
        None,
        description="when it loads: at start, or on its first request (none: the first "
        "model configured at start, the others on demand)",
    )
    output: Literal["classes", "image"] = Field(
        "classes", description="vision: what the model returns, class scores or an image"
    )
    arch: str | None = Field(
        default=None,
        pattern=r"^[a-z][a-z0-9_]{0,63}$",
        description="vision, a weights file: its torchvision architecture (`resnet18`)",
    )
    pipeline_config: Path | None = Field(
        None,
        description="diffusion, a single-file checkpoint: a diffusers folder holding its "
        "pipeline's configs (model_index.json and each component's), so nothing is fetched",
    )
    temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=2.0,
        description="generation: the temperature a request takes where it sets none, on "
        "every API (as an Ollama Modelfile's PARAMETER)",
    )
    top_p: float | None = Field(
        default=None, gt=0.0, le=1.0, description="generation: the default top_p"
    )
    top_k: int | None = Field(
        default=None, ge=0, le=1_000_000, description="generation: the default top_k"
    )
    min_p: float | None = Field(
        default=None, ge=0.0, le=1.0, description="generation: the default min_p"
    )
    repeat_penalty: float | None = Field(
        default=None, gt=0.0, le=10.0, description="generation: the default repeat penalty"
    )
    stop: tuple[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)], ...] = Field(
        default=(),
        max_length=MAX_STOP,
        description="generation: the default stop strings (up to 4, of up to 64 characters)",
    )
    system: str | None = Field(
        default=None,
        min_length=1,
        max_length=100_000,
        description="generation: the system prompt a chat without one of its own gets first "
        "(as an Ollama Modelfile's SYSTEM)",
    )
    thinking_budget: int | None = Field(
        default=None,
        ge=0,
        le=1_048_576,
        description="generation, a reasoning model: the most tokens it thinks before its "
        "answer where a request sets no budget (none: unbounded)",
    )
    pulled_from: str | None = Field(
        default=None,
        max_length=300,
        description="where `vramgate pull` took it from on the Hugging Face Hub "
        "(`hf:ORG/NAME:QUANT`): Ollama's spelling of it, `hf.co/ORG/NAME:QUANT` (any case), "
        "names this model too",
    )
    device: str | None = Field(
        default=None,
        pattern=DEVICE_ID_PATTERN,
        description="where it runs, of the server's devices (`cuda:1`; none: where it fits "
        "with the most room)",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=16,
        description="on how many devices a copy of it serves (requests go where they fit soonest)",
    )

    buckets: tuple[SimulatedBucket, ...] = Field(
        DEFAULT_SIMULATED_BUCKETS, description="simulated only: its declared buckets"
    )
    load_ms: float = Field(
        default=0, ge=0, le=600_000, description="simulated only: its declared load time"
    )
    weights: ByteSize = Field(
        ByteSize(0), description="simulated only: the bytes its weights hold while loaded"
    )
    inject: FaultInjection = Field(
        FaultInjection(), description="simulated only: faults raised on chosen calls"
    )
    generation: SimulatedGeneration | None = Field(
        None,
        description="simulated only: generation priced by its KV bytes (none: by the words "
        "buckets)",
    )
    images: SimulatedImages | None = Field(
        None, description="simulated only: an image generator instead"
    )
    # the file of the served model `draft` names, found by the server's settings
    # (`pair_draft`): not a setting of its own
    _draft_file: Path | None = PrivateAttr(None)

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

    @model_validator(mode="after")
    def _draft_of_a_gguf(self) -> ModelSpec:
        """A draft model is for a GGUF generation model that speculates, and is another
        model (by name: Settings checks that it is served) or a .gguf file."""
        draft = self.draft
        if draft is None:
            return self
        own = f"model {self.name!r}: its draft {draft!r}"
        gguf = self.path is not None and self.path.suffix.lower() == ".gguf"
        if self.kind != "generation" or not gguf or self.engine == "torch":
            raise ValueError(f"{own}: a draft model is for a GGUF generation model on llama.cpp")
        if not self.speculative:
            raise ValueError(f"{own}: a draft model speculates, and it has speculative = false")
        if draft == self.name:
            raise ValueError(f"{own}: a model cannot be its own draft")
        if not draft.lower().endswith(".gguf") and not re.match(MODEL_NAME_PATTERN, draft):
            raise ValueError(f"{own} is neither a model's name nor a .gguf file")
        return self

    def pair_draft(self, served: dict[str, ModelSpec]) -> None:
        """Find its draft's file among the `served` models (by name; a `draft` that names
        none is a .gguf file of its own), or raise a ValueError saying why that draft
        cannot be."""
        draft = self.draft
        if draft is None:
            return
        found = served.get(draft)
        own = f"model {self.name!r}: its draft {draft!r}"
        if found is None and not draft.lower().endswith(".gguf"):
            names = ", ".join(sorted(served))
            raise ValueError(f"{own} is not a served model (served: {names}) nor a .gguf file")
        if found is not None:
            gguf = found.path is not None and found.path.suffix.lower() == ".gguf"
            if found.kind != "generation" or not gguf:
                raise ValueError(f"{own} is not a GGUF generation model ({found.kind})")
            self._draft_file = found.path

    def draft_file(self) -> Path | None:
        """Its draft model's .gguf: the served model's that `draft` names (found by the
        server's settings: `pair_draft`), else `draft` itself as a path (None: no
        draft, or a name not yet found)."""
        if self.draft is None:
            return None
        if self._draft_file is not None:
            return self._draft_file
        return Path(self.draft).expanduser() if self.draft.lower().endswith(".gguf") else None

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
