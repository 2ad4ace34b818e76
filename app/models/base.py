"""What every model handler shares: its prepared work (a bucket and a payload), what
identifies its weights, loading, and the stages its requests pass (how they run is its
engine's: app.models.stages). Capabilities live in app.models.kinds."""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.config.settings import ModelSpec
from app.devices.base import Device
from app.models.card import ModelCard
from app.models.prefix_cache import PrefixStore
from app.models.prepared import Bucket, Prepared
from app.sched.budget import Geometry, LoadLedger

if TYPE_CHECKING:
    from app.models.decoding import TokenStream
    from app.models.stages import Launched, Pools


class LoadOutOfMemory(RuntimeError):
    """A model's load that ran out of memory, as its engine said it in its own words (an
    engine in another process: llama.cpp's runner). Like the device's own out-of-memory
    (`Device.is_oom`), a transient: another program may have taken the memory after the
    gate admitted the load."""


@dataclass(frozen=True)
class Exercises:
    """Requests a model's warm-up or probe sends through the normal path: one-shot
    batches asked of `capability` (an app.models.kinds contract), and prompts."""

    capability: type[ModelHandler] | None = None
    batches: tuple[list[Any], ...] = ()
    prompts: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoadProgress:
    """How far a model's load has come, as its engine can tell: the phase it is in (of
    how many) and the bytes it holds so far against those it was planned to take. What
    /status shows of a loading model and its load's log lines (app.core.lifecycle.
    load_watch) come from it."""

    phase: str  # in words: "loading the weights"
    step: int | None = None  # the phase's place, from 1
    steps: int | None = None
    held_bytes: int | None = None  # what the load holds so far, measured
    planned_bytes: int | None = None  # what it was planned to take

    @property
    def fraction(self) -> float | None:
        """The bytes held of those planned, below 1 until the load is done (None where
        either is unknown)."""
        if self.held_bytes is None or not self.planned_bytes:
            return None
        return round(min(max(self.held_bytes / self.planned_bytes, 0.0), 0.99), 3)


# What identifies a model's weights: every file's name, size and modification time, and
# the bytes of the small files that describe it (config.json and the like).
_DESCRIBING = {".json", ".txt", ".model", ".yaml", ".yml"}
_DESCRIBING_MAX_BYTES = 1 << 20


def dtype_on(device: Device, requested: str) -> str:
    """The dtype a torch model of the one-shot kinds loads in: the spec's, or for `auto`
    float16 on CUDA and float32 elsewhere."""
    if requested != "auto":
        return requested
    return "float16" if device.kind == "cuda" else "float32"


def weight_file_bytes(folder: Path, element: int) -> int:
    """The safetensors files' bytes in `folder`, scaled from the element size they are
    saved in (config.json's dtype; 2 bytes when unsaid) to `element`."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    name = config.get("torch_dtype") or config.get("dtype") or "float16"
    stored = 4 if name in ("float32", "fp32") else 2
    total = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return total * element // stored


def weights_fingerprint(path: Path) -> str:
    """A short digest that changes when the model at `path` (a folder or a file) does:
    `pull --force`, a retrained checkpoint, an edited config. Prices learned for other
    weights do not apply to these."""
    digest = hashlib.sha256()
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    for file in files:
        try:
            stat = file.stat()
        except OSError:
            continue
        name = file.relative_to(path).as_posix() if path.is_dir() else file.name
        digest.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        if file.suffix in _DESCRIBING and stat.st_size <= _DESCRIBING_MAX_BYTES:
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file's object; {} where there is none (missing, unreadable, not an object)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


TEMPLATE_MAX_BYTES = 1 << 20


def _own_file(folder: Path, name: str) -> Path | None:
    """`folder/name` if it is a regular file of that folder: no link (a pulled folder
    whose template links to a private key must not hand the key out), nothing outside."""
    path = folder / name
    if path.is_symlink() or not path.is_file() or path.stat().st_size > TEMPLATE_MAX_BYTES:
        return None
    if not path.resolve().is_relative_to(folder.resolve()):
        return None
    return path


def read_chat_template(folder: Path) -> str | None:
    """A model folder's chat template: its own file, or its tokenizer config's entry;
    None where it has none (or only behind a link)."""
    own = _own_file(folder, "chat_template.jinja")
    if own is not None:
        return own.read_text(encoding="utf-8", errors="replace")
    config = _own_file(folder, "tokenizer_config.json")
    template = read_json_object(config).get("chat_template") if config is not None else None
    return template if isinstance(template, str) else None


class ModelHandler(ABC):
    """What every model is: weights that load, unload and describe themselves. What a
    model can *do* is one of the capability contracts of app.models.kinds (an embedder,
    an image model, a text generator), which a handler inherits; the server asks for a
    capability by its type, never by a flag or a name."""

    kind: str
    engine = "torch"  # what runs it (app.engines.table.HANDLERS)
    capability_names: tuple[str, ...] = ()  # each contract of app.models.kinds adds its own
    dimensions = 0  # an embedding's width, or an image model's class count

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.dtype = "float32"
        self.fingerprint = ""  # set by `identify()` at load: names these weights in prices
        self.forward_calls = 0  # written by the inference threads; read for /status
        # when its work last showed life (time.monotonic): a job of many steps (a long
        # audio's windows, a diffusion's steps) beats here, so that the watchdog, which
        # gives up on a job silent for `run_timeout`, sees it progress
        self.progress_at = 0.0

    def identify(self) -> str:
        """What identifies the weights this handler serves (see weights_fingerprint);
        a handler with a `path` is identified by it, others by their spec."""
        path = getattr(self, "path", None)
        if isinstance(path, Path) and path.exists():
            return weights_fingerprint(path)
        return hashlib.sha256(self.spec.model_dump_json().encode()).hexdigest()[:16]

    def expected_weights_bytes(self, device: Device) -> int:
        """The bytes loading will take on `device`, known before loading: the weight
        files' sizes scaled by the element size the device will hold them in (0:
        unknown). The gate admits a load for this much."""
        return 0

    def fitted_bytes(self, device: Device, room: int) -> int:
        """The bytes its load will take where at most `room` can ever be given to it: a
        model that can leave part of itself on the CPU (a GGUF's layers) plans to fit;
        others take what they take (`expected_weights_bytes`)."""
        return self.expected_weights_bytes(device)

    @abstractmethod
    def load(self, device: Device) -> None:
        """Load weights onto `device`. Runs once, in a background thread."""

    def weights_bytes(self) -> int:
        """Bytes of the loaded weights as its engine counts them; 0 when unloaded."""
        return 0

    def load_progress(self) -> LoadProgress | None:
        """How far its load under way has come, where its engine can tell (asked from
        other threads while `load` runs); None otherwise."""
        return None

    # -- its requests' stages (app.models.stages): its engine says where each runs ------
    @abstractmethod
    def start(self, prepared: Prepared, stream: TokenStream | None, pools: Pools) -> Launched:
        """Begin an admitted request's device work: a one-shot group's merged rows, or a
        generation streaming its text to `stream`. The future resolves when the device
        is done, with the output and what the run measured."""

    async def finish(self, raw: Any, pools: Pools) -> Any:
        """A one-shot group's output as its rows (one per input, in order); by default
        the output itself."""
        return raw

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        """Several requests as one forward (continuous batching), or None if they cannot
        share one (too many inputs together, or a model whose requests never do). The
        rows of the result follow `parts`."""
        return parts[0] if len(parts) == 1 else None

    def stop(self, prepared: Prepared) -> None:
        """A running one-shot job's rows may stop early: its client left, or the server
        is stopping past its drain. Called on the event loop while the forward runs on
        its thread; a handler that can stop between steps or batches does so there, and
        what it answers then is dropped. Default: the rows run to their end."""
        return None

    def batch_group(self, prepared: Prepared) -> str:
        """What requests must share to run in one forward, beyond their model ("": any
        may, as far as `merge` allows). Waiting requests are grouped by it, so that one
        of another shape between them does not keep them apart."""
        return ""

    def prior_bytes(self, bucket: Bucket) -> int:
        """A declared or estimated cost before anything was measured (0: unknown)."""
        return 0

    def kv_geometry(self, prompt_tokens: int) -> Geometry | None:
        """What a generation of a `prompt_tokens` prompt costs from the model's config,
        before any measurement (app.models.kinds.Generator.geometry); None for a model
        whose requests hold no KV cache."""
        return None

    def leaner(self, prepared: Prepared) -> Prepared | None:
        """The same work run in fewer bytes and more slowly (an image's VAE decoded in
        tiles), or None: there is no such way. The server runs it so when its full price
        cannot start now but this one can, or can never fit the device
        (app.core.scheduler.Scheduler.prefer)."""
        return None

    @abstractmethod
    def exercises(self, probe_only: bool) -> Exercises:
        """What its warm-up sends after loading (so the common buckets have learned
        prices), or with `probe_only` the readiness probe's one tiny request."""

    # What loads measured (set by the registry): a handler whose load is sized by its
    # settings (a GGUF's layers and context) plans from it once it has been measured
    loads: LoadLedger | None = None
    # Where ended generations' KV is kept for prompts that begin the same way (set by
    # the registry: one per device; app.models.prefix_cache); a model may not use it
    prefix_store: PrefixStore | None = None

    # Whether its requests hold nothing beyond what its load reserved (a runner's KV
    # cells): they are quoted at no bytes and admitted by `cell_capacity` alone.
    requests_reserved = False

    @property
    def cell_capacity(self) -> int | None:
        """The cells of its own pool its requests are admitted from (a runner's KV
        cells, or its slots), beside the device's bytes; None: it has none."""
        return None

    def cells_for(self, prepared: Prepared) -> int:
        """The cells of `cell_capacity` a request takes while it runs: by default one
        (a capacity of requests at once, a sliding-window model's one stream)."""
        return 1

    def held_bytes(self, prepared: Prepared) -> int:
        """The bytes a request holds within what its model reserved at load (its cells'),
        shown as its price where `requests_reserved`; 0 otherwise."""
        return 0

    def measured_load_bytes(self) -> int | None:
        """What the load took as the engine itself measured it, where that is not the
        growth of this process's allocations (a runner process's); None: that growth."""
        return None

    def exited(self) -> int | None:
        """A runner process's exit code once it ended by itself; None while it serves
        (and for in-process engines)."""
        return None

    def ended_because(self) -> str | None:
        """Why its runner process ended, where we ended it (`stalled`); None otherwise."""
        return None

    # how long a call into its engine may take before the engine is taken for gone, and
    # a run may show no life (the server's `run_timeout`; set by the registry)
    run_timeout = 120.0

    def stalled(self) -> bool:
        """Its work showed no life for `run_timeout`. An engine whose work runs in a
        process of its own ends that process (the work then fails with the runner's
        error, and the next request loads it again) and says True: nothing of ours is
        wedged. In-process work cannot be ended: False, a thread that may never come
        back (the watchdog's business)."""
        return False

    def unload(self) -> None:
        """Drop the weights; `load` may be called again later."""
        return None

    def prime(self) -> None:
        """One unmeasured forward right after loading, so one-time lazy allocations
        (kernels, thread pools) land in the weights baseline and not in a bucket's price."""
        return None

    def capabilities(self) -> tuple[str, ...]:
        """What every contract it fulfils lets it be asked for (the card's)."""
        names = (c.__dict__.get("capability_names", ()) for c in type(self).__mro__)
        return tuple(dict.fromkeys(name for group in names for name in group))

    def card(self) -> ModelCard:
        """What it is, for routes and people (app.models.card); a handler that knows more
        of itself (an architecture, a context, a chat template) says it."""
        architecture, stored = self.kind, "none"
        path = getattr(self, "path", None)
        if isinstance(path, Path) and path.is_dir():  # a Hugging Face folder says its family
            config = read_json_object(path / "config.json")
            architecture = str(config.get("model_type") or self.kind)
            stored = "safetensors" if any(path.glob("*.safetensors")) else "none"
        return ModelCard(
            kind=self.kind,
            engine=self.engine,
            capabilities=self.capabilities(),
            architecture=architecture,
            format=stored,
            quantization=self.dtype,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "engine": self.engine,
            "capabilities": list(self.capabilities()),  # the card's: vision, tools, ...
            "dtype": self.dtype,
            "dimensions": self.dimensions,
            "max_batch": self.spec.max_batch,
            "forward_calls": self.forward_calls,
        }
