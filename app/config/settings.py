"""One frozen Settings object: defaults < TOML config file < VRAMGATE_* env < CLI flags.

Nothing else in vramgate reads the environment. The object is built once at start
(`load_settings`) and passed down.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import (
    ByteSize,
    Field,
    SecretStr,
    TypeAdapter,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from app.config.durations import keep_alive_seconds
from app.config.model_spec import MODEL_NAME_PATTERN as MODEL_NAME_PATTERN
from app.config.model_spec import ModelSpec as ModelSpec
from app.config.model_spec import is_reserved_name as is_reserved_name
from app.config.priorities import PRIORITY_NAMES
from app.config.simulated_spec import FaultInjection as FaultInjection
from app.config.simulated_spec import SimulatedBucket as SimulatedBucket
from app.config.simulated_spec import SimulatedGeneration as SimulatedGeneration
from app.config.simulated_spec import SimulatedImages as SimulatedImages

APP_NAME = "vramgate"
ENV_PREFIX = "VRAMGATE_"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
DEFAULT_MAX_STREAMS = 32  # rows of a generation batch wait on threads that do no work
_SIZE = r"\d+(\.\d+)?\s*[KMGT]i?B"
_DEVICE_PATTERN = re.compile(
    rf"^(auto|cpu|cuda(:\d{{1,2}}(,\d{{1,2}})*)?|simulated:(?P<sizes>{_SIZE}(\s*,\s*{_SIZE})*))$"
)
_BYTES = TypeAdapter(ByteSize)


def parse_bytes(text: str | int) -> int:
    """Parse '512MiB', '2GiB' or a plain number of bytes."""
    return int(_BYTES.validate_python(text))


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


def _pattern_pairs(value: Any, what: str, target: str) -> Any:
    """A table of glob patterns from `pattern=target,...` (a flag or an environment
    variable) or JSON; a dict as it is."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            return json.loads(text)
        pairs = [part.split("=", 1) for part in text.split(",") if part.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"{what} {value!r} are not pattern={target},...")
        return {pattern.strip(): name.strip() for pattern, name in pairs}
    return value


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
    model_aliases: Annotated[dict[str, str], NoDecode] = Field(
        {},
        description="names clients send, mapped to served models: glob pattern to model, "
        'first match wins, e.g. "claude-*" = "coder" for Claude Code, "gpt-*" = "coder" for '
        "Codex (a [model_aliases] table in the config file; pattern=model,... as a flag)",
    )
    priorities: Annotated[dict[str, str], NoDecode] = Field(
        {},
        description="classes by the model name a client sends, the program that calls "
        "(`caller:` and a glob of its User-Agent) or the route it calls: glob "
        'pattern to priority|interactive|background, first match wins, e.g. "task" = '
        '"background" with a model alias "task" for Open WebUI\'s task model, '
        '"caller:my-indexer/*" = "background", or '
        '"/api/embed" = "background" (a [priorities] table in the config file; '
        "pattern=class,... as a flag); a request's own service_tier, priority or "
        "X-Vramgate-Priority wins",
    )
    background_inputs: int = Field(
        32,
        ge=0,
        le=100_000,
        description="an embeddings or rerank request of at least this many inputs is "
        "background unless it asks otherwise (a document's chunks); 0: never",
    )
    background_aging_s: float = Field(
        60.0,
        ge=0,
        le=86_400,
        description="background work that has waited this long counts as interactive: "
        "the longest it steps aside",
    )
    background_steps_aside: bool = Field(
        True,
        description="background work waits while interactive work runs or waits on its "
        "device (false: it runs beside it, ordered after it and kept off the reserve)",
    )
    background_single_after_s: float | None = Field(
        None,
        ge=0,
        le=86_400,
        description="for this long after a person's (interactive) work ran on a device, "
        "background work there runs one request at a time, so the person's next request "
        "finds at most one beside it; default: 30 on a CPU (whose steps share its cores: "
        "bench/priority.py), 0 (off) on a GPU",
    )
    max_body_bytes: ByteSize = Field(
        ByteSize(32 * 2**20),
        description="largest request body accepted (413 beyond): an audio file, images in "
        "a chat, an agent's whole conversation",
    )
    max_inputs: int = Field(256, ge=1, le=4096, description="inputs in one embeddings request")
    max_input_chars: int = Field(
        400_000,
        ge=1,
        le=10_000_000,
        description="characters in one input string, or in one chat's messages (a coding "
        "agent resends ~100k characters of prompt and history)",
    )
    max_image_side: int = Field(
        4096, ge=16, le=16384, description="largest image side accepted, in pixels"
    )
    max_image_pixels: int = Field(
        16 * 2**20, ge=256, le=64 * 2**20, description="largest image accepted, in pixels"
    )
    max_images: int = Field(16, ge=1, le=256, description="images in one predict request")
    image_url_ttl_s: float = Field(
        600.0,
        gt=0,
        le=86_400,
        description="how long a generated image asked for as a `url` is kept and served "
        "(/v1/images/files/{id}; the newest 256 images, 512 MiB at most), in seconds",
    )
    max_audio_seconds: float = Field(
        7200.0,
        gt=0,
        le=86_400,
        description="longest audio a transcription accepts, in seconds (400 beyond; the "
        "upload is bounded by max_body_bytes too)",
    )
    max_audio_bytes: int = Field(
        2 * 2**30,
        ge=2**20,
        le=2**40,
        description="host memory that transcriptions waiting or running may hold "
        "together: their uploads and decoded audio (16 kHz float32, 64 KB a second: a "
        "2-hour file is 461 MB, twice that while it is joined); past it, 503 "
        "audio_memory_full with Retry-After",
    )
    default_max_tokens: int = Field(
        512,
        ge=1,
        le=1_048_576,
        description="a generation's max_tokens when the request gives none (priced for it)",
    )
    models_dir: Path | None = Field(
        None, description="where `vramgate pull` puts models (default: DATA_DIR/models)"
    )
    ollama_names: Path | None = Field(
        None,
        description="a TOML table of Ollama library names, shaped as the shipped "
        "app/config/ollama_names.toml's [[names]]: its names are added to the shipped "
        "ones, and replace those of the same name",
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
        30.0,
        ge=0.5,
        le=3600,
        description="seconds between the readiness probe's tiny inferences, each run only "
        "after an interval in which no request completed and none runs",
    )
    keep_alive: float = Field(
        300.0,
        description="how long an idle model stays loaded: seconds, or 30s, 5m, 1h; 0 unloads "
        "it after each request, -1 never (a model's own `keep_alive` and a request's win)",
    )
    data_dir: Path | None = Field(
        None, description="learned prices live here (default: user data dir)"
    )
    max_stored_responses: int = Field(
        1000,
        ge=0,
        le=1_000_000,
        description="Responses API answers kept in DATA_DIR/responses for "
        "previous_response_id and GET /v1/responses/{id}; the oldest go beyond it (0: none)",
    )
    max_stored_response_bytes: ByteSize = Field(
        ByteSize(256 * 2**20),
        description="what the stored Responses API answers may take on disk together; the "
        "oldest go beyond it, and an answer bigger than this alone is not stored",
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

    @field_validator("model_aliases", mode="before")
    @classmethod
    def _alias_pairs(cls, value: Any) -> Any:
        """`pattern=model,pattern=model` (a flag or an environment variable) or JSON."""
        return _pattern_pairs(value, "model aliases", "model")

    @field_validator("priorities", mode="before")
    @classmethod
    def _priority_pairs(cls, value: Any) -> Any:
        """`pattern=class,...` (a flag or an environment variable) or JSON."""
        return _pattern_pairs(value, "priorities", "class")

    @field_validator("priorities")
    @classmethod
    def _known_classes(cls, value: dict[str, str]) -> dict[str, str]:
        for pattern, name in value.items():
            if name.strip().lower() not in PRIORITY_NAMES:
                raise ValueError(
                    f"priorities: {pattern!r} names {name!r}, not one of "
                    f"{', '.join(PRIORITY_NAMES)}"
                )
        return value

    @model_validator(mode="after")
    def _aliases_name_served_models(self) -> Settings:
        served = {spec.name for spec in self.models}
        for pattern, model in self.model_aliases.items():
            if model not in served:
                raise ValueError(
                    f"model alias {pattern!r} names {model!r}, which is not served "
                    f"(served: {', '.join(sorted(served))})"
                )
        return self

    @model_validator(mode="after")
    def _drafts_name_served_models(self) -> Settings:
        served = {spec.name: spec for spec in self.models}
        for spec in self.models:
            spec.pair_draft(served)
        return self

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
