"""One frozen Settings object: defaults < TOML config file < VRAMGATE_* env < CLI flags.

Nothing else in vramgate reads the environment. The object is built once at start
(`load_settings`) and passed down.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import (
    AliasChoices,
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from app.durations import keep_alive_seconds
from app.simulated_spec import (
    DEFAULT_SIMULATED_BUCKETS,
    FaultInjection,
    SimulatedBucket,
    SimulatedGeneration,
)

APP_NAME = "vramgate"
ENV_PREFIX = "VRAMGATE_"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
DEFAULT_MAX_STREAMS = 32  # rows of a generation batch wait on threads that do no work
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_RESERVED = {"CON", "PRN", "AUX", "NUL"} | {f"{p}{i}" for p in ("COM", "LPT") for i in range(10)}


def is_reserved_name(name: str) -> bool:
    """Windows device names (CON, NUL, COM1...), with or without an extension."""
    return name.split(".")[0].upper() in _RESERVED


_SIZE = r"\d+(\.\d+)?\s*[KMGT]i?B"
_DEVICE_PATTERN = re.compile(
    rf"^(auto|cpu|cuda(:\d{{1,2}}(,\d{{1,2}})*)?|simulated:(?P<sizes>{_SIZE}(\s*,\s*{_SIZE})*))$"
)
# a model's own device: one of the server's (cuda:1, simulated:0, cpu)
DEVICE_ID_PATTERN = r"^(cpu|cuda:\d{1,2}|simulated:\d{1,2})$"
_BYTES = TypeAdapter(ByteSize)


def parse_bytes(text: str | int) -> int:
    """Parse '512MiB', '2GiB' or a plain number of bytes."""
    return int(_BYTES.validate_python(text))


class ModelSpec(BaseModel):
    """One model to serve. `kind` picks the handler; `path` None means the embedded model."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=MODEL_NAME_PATTERN)
    kind: Literal["embedding", "generation", "vision", "rerank", "simulated"] = "embedding"
    path: Path | None = None  # a folder; for generation also a .gguf file
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    max_batch: int = Field(default=32, ge=1, le=1024)
    # generation: the context cap (llama.cpp: each slot's cells); `context_length` too
    max_context: int = Field(
        default=4096,
        ge=16,
        le=1_048_576,
        validation_alias=AliasChoices("max_context", "context_length"),
    )
    # generation: which engine runs it (auto: llama.cpp for a .gguf file where xllamacpp
    # is installed, else torch), and llama.cpp's own knobs
    engine: Literal["auto", "torch", "llama.cpp"] = "auto"
    parallel: int = Field(default=4, ge=1, le=64)  # llama.cpp: requests at once (slots)
    kv_cache_type: Literal["f16", "q8_0", "q4_0"] = "f16"  # llama.cpp: KV cells' type
    flash_attention: Literal["auto", "on", "off"] = "auto"  # llama.cpp
    gpu_layers: int | Literal["auto"] = Field(default="auto")  # llama.cpp: auto = the gate's
    threads: int = Field(default=0, ge=0, le=512)  # llama.cpp: CPU threads (0: its default)
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

        if self.kind == "generation" and self.path is None:
            raise ValueError(f"model {self.name!r}: a {self.kind} model needs a path")
        return self

    @classmethod
    def parse_cli(cls, text: str) -> ModelSpec:
        """`NAME=KIND` or `NAME=KIND:PATH`, e.g. `sim=simulated`, `bge=embedding:/models/bge`."""
        name, sep, rest = text.partition("=")
        if not sep:
            raise ValueError(f"model spec {text!r} is not NAME=KIND[:PATH]")
        kind, _, path = rest.partition(":")
        return cls(name=name, kind=kind, path=Path(path) if path else None)  # type: ignore[arg-type]


def is_loopback_host(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1 (brackets allowed)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def default_config_file() -> Path:

    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)) / "config.toml"


class Settings(BaseSettings):
    """Every knob of the server. Field descriptions double as `--help` text."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="address to listen on (loopback by default)")
    port: int = Field(8450, ge=0, le=65535, description="TCP port (0 picks a free one)")
    ollama_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="also listen on this port (Ollama's is 11434), for programs that speak "
        "only Ollama's API and cannot be pointed elsewhere; off by default",
    )
    device: str = Field(
        "auto",
        description="auto (every CUDA GPU, else the CPU) | cpu | cuda:N | cuda:0,1 | "
        "simulated:<size>[,<size>...] such as simulated:8GiB,4GiB (fake GPUs)",
    )
    reserve: ByteSize | None = Field(
        None,
        description="device memory never handed to jobs (default: 512MiB on CUDA, "
        "1GiB of RAM on CPU, 0 when simulated)",
    )
    headroom: ByteSize = Field(
        ByteSize(512 * 2**20),
        description="memory jobs keep beside the models' weights: a model loads when its "
        "weights and this fit; when other programs leave less, idle models are unloaded",
    )
    max_queue: int = Field(256, ge=0, le=100_000, description="requests that may wait at once")
    queue_timeout: float = Field(
        60.0, gt=0, le=3600, description="seconds a request may wait in the queue before 504"
    )
    max_concurrent: int = Field(
        0,
        ge=0,
        le=256,
        description="jobs on the device at once (0: 4 on CUDA, 1 on CPU, 8 simulated)",
    )
    max_streams: int = Field(
        0,
        ge=0,
        le=256,
        description="generation streams on the device at once (the rows of a model's "
        "batch), beside max_concurrent one-shot jobs; bytes bind them too (0: 32)",
    )
    max_head_bypass: int = Field(
        16,
        ge=0,
        le=10_000,
        description="how often smaller jobs may overtake the job at the head of the queue",
    )
    max_batch_wait_ms: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="how long a request that could run at once waits for others to join "
        "its batch (0: it runs at once; while the device is busy, requests gather anyway)",
    )
    cpu_threads: int = Field(0, ge=0, le=1024, description="torch intra-op threads (0: auto)")
    models: tuple[ModelSpec, ...] = Field(
        (ModelSpec(name=DEFAULT_MODEL_NAME),),
        description="models to serve, NAME=KIND[:PATH] on the command line (repeatable)",
    )
    max_body_bytes: ByteSize = Field(
        ByteSize(4 * 2**20), description="largest request body accepted (413 beyond)"
    )
    max_inputs: int = Field(256, ge=1, le=4096, description="inputs in one embeddings request")
    max_input_chars: int = Field(
        50_000, ge=1, le=10_000_000, description="characters in one input string"
    )
    max_image_side: int = Field(
        4096, ge=16, le=16384, description="largest image side accepted, in pixels"
    )
    max_image_pixels: int = Field(
        16 * 2**20, ge=256, le=64 * 2**20, description="largest image accepted, in pixels"
    )
    max_images: int = Field(16, ge=1, le=256, description="images in one predict request")
    default_max_tokens: int = Field(
        512,
        ge=1,
        le=1_048_576,
        description="a generation's max_tokens when the request gives none (priced for it)",
    )
    models_dir: Path | None = Field(
        None, description="where `vramgate pull` puts models (default: DATA_DIR/models)"
    )
    token: SecretStr | None = Field(
        None,
        description="bearer token every route but /health requires; `auto` generates one "
        "into DATA_DIR/token (readable by you only); needed to listen beyond loopback",
    )
    allowed_hosts: tuple[str, ...] = Field(
        (), description="Host names accepted besides localhost and loopback IPs (comma list)"
    )
    cors_origins: tuple[str, ...] = Field(
        (),
        description="web origins allowed to call the API from a browser, e.g. "
        "http://localhost:3000 (comma list; `*` is refused)",
    )

    @field_validator("allowed_hosts", "cors_origins", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("cors_origins")
    @classmethod
    def _no_wildcard_origin(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for origin in value:
            if origin == "*" or not re.match(r"^https?://[^/\s]+$", origin):
                raise ValueError(f"cors origin {origin!r} is not scheme://host[:port]")
        return tuple(origin.lower() for origin in value)

    @property
    def loopback(self) -> bool:
        return is_loopback_host(self.host)

    run_timeout: float = Field(
        120.0,
        ge=0.1,
        le=86_400,
        description="seconds a job (or a stream between two tokens) may show no progress "
        "before it gets 504; a thread still not back after as long again restarts the server",
    )
    health_interval: float = Field(
        30.0, ge=0.5, le=3600, description="seconds between the readiness probe's tiny inferences"
    )
    keep_alive: float = Field(
        300.0,
        description="how long an idle model stays loaded: seconds, or 30s, 5m, 1h; 0 unloads "
        "it after each request, -1 never (a model's own `keep_alive` and a request's win)",
    )
    data_dir: Path | None = Field(
        None, description="learned prices live here (default: user data dir)"
    )
    log_dir: Path | None = Field(None, description="rotating log files (default: user log dir)")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _keep_alive(cls, value: object) -> float:
        return keep_alive_seconds(value)

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        match = _DEVICE_PATTERN.match(value.strip())
        if not match:
            raise ValueError(
                f"device {value!r} is not auto, cpu, cuda[:N[,N...]] or simulated:<size>[,...]"
            )
        sizes = match.group("sizes")
        if sizes and any(parse_bytes(size.strip()) <= 0 for size in sizes.split(",")):
            raise ValueError("a simulated device needs a positive size")
        return value.strip()

    @field_validator("models")
    @classmethod
    def _unique_names(cls, value: tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
        names = [m.name for m in value]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        if not value:
            raise ValueError("at least one model is needed")
        return value

    @property
    def resolved_data_dir(self) -> Path:
        return self.data_dir or Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))

    @property
    def resolved_models_dir(self) -> Path:
        return self.models_dir or self.resolved_data_dir / "models"

    @property
    def resolved_log_dir(self) -> Path:

        return self.log_dir or Path(platformdirs.user_log_dir(APP_NAME, appauthor=False))

    def simulated_capacities(self) -> tuple[int, ...]:
        """The simulated devices' sizes (empty: the device is not simulated)."""
        match = _DEVICE_PATTERN.match(self.device)
        sizes = match.group("sizes") if match else None
        return tuple(parse_bytes(size.strip()) for size in sizes.split(",")) if sizes else ()

    def redacted(self) -> dict[str, Any]:
        """The resolved settings for the start-up log line; the token never appears."""
        shown = self.model_dump(mode="json")
        shown["token"] = "(set)" if self.token is not None else None
        return shown


def config_path() -> Path:
    """The config file in use: VRAMGATE_CONFIG, else the user config dir's."""
    return Path(os.environ.get(ENV_PREFIX + "CONFIG") or default_config_file())


def read_config_file(path: Path) -> dict[str, Any]:

    if not path.is_file():
        return {}
    with path.open("rb") as handle:
        return tomllib.load(handle)


class _FileSource(PydanticBaseSettingsSource):
    """Values from the TOML config file, lowest priority above the defaults."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def load_settings(cli: dict[str, Any] | None = None, config_file: Path | None = None) -> Settings:
    """Build the one Settings object. `cli` holds only the flags the user gave."""
    file_data = read_config_file(config_file or config_path())

    class _Layered(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, _FileSource(settings_cls, file_data))

    layered = _Layered(**(cli or {}))
    return Settings.model_construct(**dict(layered))


@dataclass(frozen=True)
class ConfigSource:
    """Where a server's settings came from (its config file and the flags given), so
    that it can read its model list again, and `pull` can add to the same file."""

    file: Path
    overrides: dict[str, Any] = field(default_factory=dict)

    def settings(self) -> Settings:
        return load_settings(self.overrides, self.file)
