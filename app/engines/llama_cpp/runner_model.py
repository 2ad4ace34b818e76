"""A GGUF model in a llama.cpp runner process of its own (app.engines.llama_cpp.runner_main through
app.engines.llama_cpp.process), as Ollama runs its runners, whatever the model does: its load
sized from the file's header and what earlier loads measured, split between GPU and CPU,
the process started, measured, adopted by the device and ended. The server talks to it
over loopback HTTP (llama.cpp's own listener on 127.0.0.1, guarded by a per-load random
key; app.engines.llama_cpp.client).

What the gate sees: a model whose weights are everything the runner reserved (weights on
the device, its KV pool, compute buffers), measured from the engine's own log, and whose
requests each take cells of that pool (app.engines.llama_cpp.kv_pool): a request costs no
further device bytes; it waits in vramgate's queue for free cells, never inside
llama.cpp. Each kind says how its requests take cells (`cells_for`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from app.config.settings import ModelSpec
from app.devices.base import Device
from app.engines.gguf_facts import GgufFacts, read_gguf_facts
from app.engines.llama_cpp.client import RunnerAnswer, RunnerClient
from app.engines.llama_cpp.kv_pool import KvPool
from app.engines.llama_cpp.layer_split import LayerSplit
from app.engines.llama_cpp.load.phases import PHASES, phase_of
from app.engines.llama_cpp.load.plan import SLOT_CONTEXT, LoadSettings, plan_kv_pool, split_for
from app.engines.llama_cpp.process import (
    EngineUnavailable,
    Footprint,
    RunnerProcess,
    runner_argv,
)
from app.engines.llama_cpp.runner_main import RUNNER_COMMAND
from app.engines.llama_cpp.watch import RunnerWatch
from app.errors import InvalidRequest, RunnerFailed, RunnerStopped
from app.models.base import LoadProgress, ModelHandler
from app.models.card import ModelCard
from app.models.prepared import Prepared

log = logging.getLogger("vramgate.llama_cpp")

LOAD_TIMEOUT_S = 600.0
MEASURED_ON = ("cpu", "cuda")  # where the engine's log measures a load (not simulated)
STOP_GRACE_S = 5.0
CACHE_REUSE = 256  # llama.cpp --cache-reuse: the least chunk reused by shifting its KV
PROMPT_CACHE_MAX = 8 * 2**30  # the default host prompt cache's largest: llama.cpp's own
PROMPT_CACHE_SHARE = 4  # the default takes at most a quarter of the host RAM available
PROMPT_CACHE_FLOOR = 2**30  # ... and at least one request's KV, up to this


# Set once a runner could not import the engine: every later load is refused at once,
# with the same reason, without starting a runner (the import cannot succeed later in
# this process's life: a driver installed since needs a restart anyway).
_engine_unavailable: list[str] = []


def _held(pid: int | None, device: Device) -> int | None:
    """What a starting runner holds: on a GPU the driver's figure for it, else its
    resident memory (None before it runs, or once it is gone)."""
    if pid is None:
        return None
    if device.kind == "cuda":
        return device.process_bytes(pid)
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


def llama_cpp_available() -> bool:
    """Whether xllamacpp can be imported here (found without importing it: it is loaded
    by the runner processes only)."""
    import importlib.util

    return importlib.util.find_spec("xllamacpp") is not None


class LlamaRunnerModel(ModelHandler):
    """A GGUF model in a llama.cpp runner process of its own, whatever it does: the load
    sized from the file's header and what earlier loads measured, split between GPU and
    CPU, the process started, measured, adopted by the device, and ended; each request
    takes one of its slots. Each kind (generation, embeddings) adds its requests."""

    engine = "llama.cpp"
    requests_reserved = True  # its KV cells were reserved at load: slots admit requests

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        assert spec.path is not None, "ModelSpec checks that a GGUF model has a path"
        self.path = Path(spec.path)
        self.context = spec.max_context or SLOT_CONTEXT  # a request's cells, once loaded
        self.pool: KvPool | None = None  # its KV pool, once loaded
        self.dtype = "gguf"
        self._facts: GgufFacts | None = None
        self._runner: RunnerProcess | None = None
        self._client: RunnerClient | None = None  # its listener, while loaded
        self._watch: RunnerWatch | None = None  # looks at its slots, while loaded
        # the requests sent to the runner and not yet let go of: their tags and cells
        self.open_cells: dict[int, int] = {}
        self.runner_failures = 0  # requests its runners failed (5xx, an error mid-stream)
        self._device: Device | None = None
        self._footprint = Footprint({}, {})
        self._measured: int | None = None  # on a GPU: the process's own use, as measured
        self.split: LayerSplit | None = None
        self._room: int | None = None  # the most the gate planned its load to take
        self._cache_ram: int | None = None  # the host prompt cache its load was planned with
        self._ended_because: str | None = None  # why we ended its runner (`stalled`)
        # the runner being started and its device, while `load` waits for it
        self._starting: tuple[RunnerProcess, Device] | None = None

    # -- what it is and what it will take ----------------------------------------------
    def facts(self) -> GgufFacts:
        if self._facts is None:
            self._facts = read_gguf_facts(self.path)
        return self._facts

    def _context_for(self, facts: GgufFacts) -> int:
        """The cells one request may hold, as far as the file and the setting say (the
        device may give a pool of fewer: `pool` once loaded)."""
        trained = facts.context_length or SLOT_CONTEXT
        return min(trained, self.spec.max_context or trained)

    def planned_pool(self, device: Device, free_bytes: int | None = None) -> KvPool:
        """Its KV pool on `device`: as big as the spec and the file want, shrunk to fit
        in `free_bytes` with every layer there (down to the pool's floor)."""
        return plan_kv_pool(
            self.facts(),
            self.load_settings(),
            accelerator=device.kind != "cpu",  # a simulated GPU is split like a real one
            free_bytes=free_bytes,
            learned=lambda cells, layers: self._learned(device, cells, layers),
        )

    def planned_split(self, device: Device, free_bytes: int | None = None) -> LayerSplit:
        """How many layers go to `device` for this spec (all of them on the CPU), beside
        its KV pool (`planned_pool`)."""
        pool = self.planned_pool(device, free_bytes)
        return self._split_for(device, pool.cells, free_bytes)

    def _split_for(self, device: Device, cells: int, free_bytes: int | None) -> LayerSplit:
        """The layers beside `cells` KV cells (app.engines.llama_cpp.load.plan)."""
        return split_for(
            self.facts(),
            self.load_settings(),
            cells,
            accelerator=device.kind != "cpu",
            free_bytes=free_bytes,
            learned=lambda cells, layers: self._learned(device, cells, layers),
        )

    def load_settings(self) -> LoadSettings:
        """What its config entry says about its load."""
        spec = self.spec
        budget = int(spec.kv_budget) if spec.kv_budget is not None else None
        return LoadSettings(
            spec.kv_cache_type, spec.max_context, spec.parallel, budget, spec.gpu_layers
        )

    def _load_config(self, cells: int, layers: int) -> str:
        """The settings that size a load, as the ledger keeps them."""
        return f"c{cells}k{self.spec.kv_cache_type}l{layers}"

    def _learned(self, device: Device, cells: int, layers: int) -> int | None:
        if self.loads is None or device.kind not in MEASURED_ON:
            return None
        fingerprint = self.fingerprint or self.identify()
        where = self._load_config(cells, layers)
        return self.loads.learned(self.name, self.dtype, fingerprint, where)

    def expected_weights_bytes(self, device: Device) -> int:
        return self.planned_split(device).device_bytes

    def fitted_bytes(self, device: Device, room: int) -> int:
        """The layers that fit in `room` (all, where they do): what the gate admits the
        load for, and the most the load will take (on the CPU, its host prompt cache
        too: the device's own memory)."""
        self._cache_ram = self._sized_cache(psutil.virtual_memory().available)
        ram = self.prompt_cache_ram() if device.kind == "cpu" else 0
        self._room = room - ram
        return self.planned_split(device, self._room).device_bytes + ram

    def prompt_cache_ram(self) -> int:
        """llama.cpp's host-RAM prompt cache (0: off). Idle slots' prompts move there
        (`cache_idle_slots`), out of the KV pool: a unified KV's attention spans every
        cell in use, and a pool that kept 32 idle slots' old prompts made a 1,500-token
        prompt's first token 1.5x later (tried here: 7.5 s against 5.0 s with them moved
        out, 4.9 s on a fresh pool). A request that begins as a cached prompt did takes
        its KV back from there instead of prefilling it: a conversation's next turn, a
        new chat that sends the same app's system prompt and tools. Sized when its load
        is planned (`_sized_cache`); before, one request's KV."""
        if not self.spec.prefix_cache:
            return 0
        if self.spec.prompt_cache_ram is not None:
            return int(self.spec.prompt_cache_ram)
        if self._cache_ram is not None:
            return self._cache_ram
        return min(self._request_kv_bytes(), PROMPT_CACHE_FLOOR)

    def _request_kv_bytes(self) -> int:
        facts = self.facts()
        return facts.kv_bytes_per_token(self.spec.kv_cache_type) * self._context_for(facts)

    def _sized_cache(self, available: int) -> int:
        """The default cache for a host with `available` bytes of RAM free: a quarter of
        them, at most llama.cpp's own 8 GiB, at least one request's KV (up to 1 GiB).
        One request's KV (180 MiB for SmolLM2's 8k context) kept one conversation of
        Open WebUI's at most: its title, tags and follow-up requests between two turns
        pushed the conversation out, and turn 2 prefilled its 8,031 tokens again (109.5
        s; 1.0 s with 1 GiB). On the CPU it is the device's memory, admitted with the
        load (`fitted_bytes`), and goes with the model when an idle model is unloaded to
        make room."""
        share = min(available // PROMPT_CACHE_SHARE, PROMPT_CACHE_MAX)
        return max(share, min(self._request_kv_bytes(), PROMPT_CACHE_FLOOR)) // 2**20 * 2**20

    def runner_settings(self) -> dict[str, Any]:
        """What this kind adds to the runner's settings
        (app.engines.llama_cpp.runner_main.params_of)."""
        return {}

    def loaded(self, props: dict[str, Any]) -> None:
        """The runner's /props, once it serves."""
        return None

    @property
    def cell_capacity(self) -> int | None:
        """Its KV pool's cells, which its requests are admitted from."""
        return self.pool.cells if self.pool is not None else None

    def cells_for(self, prepared: Prepared) -> int:
        """A generation's cells: its prompt and its token bound (`KvPool.cells_for`)."""
        assert self.pool is not None, "asked of a loaded model"
        task = prepared.payload
        return self.pool.cells_for(len(task.prompt_ids), task.max_tokens)

    def runner_config(self, pool: KvPool, split: LayerSplit) -> dict[str, Any]:
        """The settings its runner is started with for `pool` and `split`, all but the
        key (app.engines.llama_cpp.runner_main.params_of; bench/kv_shapes.py runs
        llama.cpp alone with them)."""
        return {
            "model": str(self.path),
            "n_ctx": pool.cells,
            "parallel": pool.slots,
            "per_slot": pool.per_request,
            "gpu_layers": split.gpu_layers_arg,
            "kv_type": self.spec.kv_cache_type.upper(),
            "flash_attention": self.spec.flash_attention,
            "threads": self.spec.threads,
            "cache_ram_mib": self.prompt_cache_ram() // 2**20,
            "cache_idle_slots": self.prompt_cache_ram() >= 2**20,
            "cache_reuse": CACHE_REUSE if self.spec.prefix_cache else 0,
            **self.runner_settings(),
        }

    # -- load and unload ---------------------------------------------------------------
    def load(self, device: Device) -> None:
        if _engine_unavailable:
            raise EngineUnavailable(_engine_unavailable[0])
        self._ended_because = None  # a new runner: whatever ended the last is no longer so
        free = self._room  # what the gate planned the load for
        if device.kind != "cpu":  # and what the device has now
            now = device.snapshot().free_for_us
            free = now if free is None else min(free, now)
        self.pool = pool = self.planned_pool(device, free)
        self.context = pool.per_request
        self.split = self._split_for(device, pool.cells, free)
        key = secrets.token_urlsafe(24)
        config = {**self.runner_config(pool, self.split), "key": key}
        # this device alone (a CUDA build on a CPU or simulated device stays off the GPU)
        env = {"CUDA_VISIBLE_DEVICES": device.child_visible()}
        argv = runner_argv("app.engines.llama_cpp.runner_main", RUNNER_COMMAND)
        runner = RunnerProcess(self.name, argv, env)
        started = time.perf_counter()
        free_before = device.snapshot().free
        self._starting = runner, device  # its progress, until it serves (its last phase)
        try:
            try:
                ready = runner.start(config, LOAD_TIMEOUT_S)
            except EngineUnavailable as exc:
                _engine_unavailable[:] = [str(exc)]
                log.error("GGUF models cannot load: %s", exc)
                raise
            self._runner, self._device = runner, device
            try:  # a load that fails past here ends its runner: nothing is left running
                self._serving(device, ready, key, free_before)
            except BaseException:
                self.unload()
                raise
        finally:
            self._starting = None
        if self.loads is not None and device.kind in MEASURED_ON:
            fingerprint = self.fingerprint or self.identify()
            where = self._load_config(pool.cells, self.split.on_device)
            load_s = time.perf_counter() - started
            # what the split measured: its weights, KV and buffers (on the CPU, the
            # host prompt cache beside them is admitted apart: `fitted_bytes`)
            ram = self.prompt_cache_ram() if device.kind == "cpu" else 0
            self.loads.record(
                self.name, self.dtype, fingerprint, where, self.weights_bytes() - ram, load_s
            )
        log.info(
            "model %s: runner pid %s, %s, a pool of %d KV cells (%d a request, %d slots), "
            "%.1f MiB on %s",
            self.name,
            ready["pid"],
            self.split.describe(),
            pool.cells,
            pool.per_request,
            pool.slots,
            self.weights_bytes() / 2**20,
            device.id,
        )

    def _serving(self, device: Device, ready: dict[str, Any], key: str, free_before: int) -> None:
        """The started runner measured, adopted by the device, and asked what it serves."""
        assert self._runner is not None
        self._footprint = self._runner.footprint()
        self._measured = self._process_bytes(device, int(ready["pid"]), free_before)
        device.adopt(int(ready["pid"]), self.weights_bytes())
        host, _, port = str(ready["address"]).removeprefix("http://").rpartition(":")
        self._client = RunnerClient(host, int(port), key, timeout_s=self.run_timeout)
        self._watch = RunnerWatch(self._client, self._alive, self.run_timeout)
        self.loaded(asyncio.run(self._client.call("GET", "/props")))  # the loader's thread

    def _process_bytes(self, device: Device, pid: int, free_before: int) -> int | None:
        """On a GPU, what the runner's process holds there beyond the buffers its log
        names (its CUDA context, the runtime's own): the driver's figure for the pid,
        else how far the device's free memory fell during the load. None elsewhere."""
        if device.kind != "cuda":
            return None
        reported = device.process_bytes(pid)
        if reported is not None:
            return reported
        return max(0, free_before - device.snapshot().free)

    def load_progress(self) -> LoadProgress | None:
        """While its runner starts: the phase the engine's log has reached, and what the
        runner holds so far (on a GPU, its memory there; else its resident memory) of what
        the load was planned to take."""
        starting, split = self._starting, self.split
        if starting is None:
            return None
        runner, device = starting
        step, phase = phase_of(runner.load_log())
        planned = split.device_bytes if split is not None else None
        return LoadProgress(phase, step, len(PHASES), _held(runner.pid, device), planned)

    def weights_bytes(self) -> int:
        """What the runner reserved on our device (on the CPU: all it allocated)."""
        if self._runner is None or self._device is None:
            return 0
        if self._device.kind == "cuda":  # the log's buffers, or the process's whole use
            return max(self._footprint.device_bytes, self._measured or 0)
        if self._device.kind == "cpu":  # and the prompt cache's RAM, which it may fill
            footprint = self._footprint
            return footprint.device_bytes + footprint.host_bytes + self.prompt_cache_ram()
        # a simulated GPU: a CPU build logs no GPU buffers; the split's own bytes stand in
        return self.split.device_bytes if self.split is not None else 0

    def footprint(self) -> Footprint:
        return self._footprint

    def measured_load_bytes(self) -> int | None:
        return self.weights_bytes()

    @property
    def runner_pid(self) -> int | None:
        return self._runner.pid if self._runner is not None else None

    def exited(self) -> int | None:
        """The runner's exit code if it ended while loaded (by itself, or by `stalled`),
        else None."""
        return self._runner.exited() if self._runner is not None else None

    def ended_because(self) -> str | None:
        return self._ended_because

    def stalled(self) -> bool:
        """Its runner's work did not move (no token, no prefill progress, no look at its
        slots that showed any) for `run_timeout`: a failed runner, ended now. Its
        requests' reads end with it (503 model_runner_stopped), and housekeeping
        unloads it; the next request loads it again. The server itself is not wedged."""
        self.end_runner(f"its work did not move for {self.run_timeout:g}s (run_timeout)")
        return True

    def end_runner(self, why: str) -> None:
        """End a failed runner at once (SIGKILL), saying `why`: the OS frees all it held,
        every cell of its pool among them."""
        runner = self._runner
        if runner is None or runner.exited() is not None:
            return
        self._ended_because = why
        log.error("model %s: the runner %s; ended", self.name, why)
        runner.kill()

    def unload(self) -> None:
        runner, self._runner = self._runner, None  # first: a `stalled` now finds none
        self._client, self._watch, self.pool = None, None, None
        self._ended_because = None
        if runner is not None:
            runner.stop(STOP_GRACE_S)
            if self._device is not None and runner.pid is not None:
                self._device.release(runner.pid)
        self._footprint, self._measured = Footprint({}, {}), None

    # -- requests ----------------------------------------------------------------------
    async def _call(
        self, path: str, body: dict[str, Any], budget_s: float | None = None
    ) -> dict[str, Any]:
        """`budget_s`: see RunnerClient.call (a long computation with no progress events)."""
        client = self._client
        if client is None:
            raise RunnerStopped(f"model {self.name!r} is not loaded; retry", retry_after=1)
        try:
            found = await client.call("POST", path, body, budget_s=budget_s, alive=self._alive)
        except RunnerAnswer as answer:
            raise self._answered(answer.status, str(answer), param="messages") from None
        except TimeoutError as exc:  # a runner that stopped answering: a failed runner
            self.stalled()
            raise self._stopped(exc) from exc
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            raise self._stopped(exc) from exc
        return found if isinstance(found, dict) else {}

    def _alive(self) -> None:
        """Its runner's work moved (or, for a computation that reports no progress, it
        answered while it computes): a beat for the watchdog."""
        self.progress_at = time.monotonic()

    def _answered(
        self, status: int, error: Any, param: str | None = None
    ) -> InvalidRequest | RunnerFailed:
        """The runner answered a request with an error: its own 4xx refuses the request
        (a prompt it cannot take: 400); anything else is its failure, never the
        caller's (503, counted in `runner_failures`). A KV pool that overflowed is a bug
        of ours (the gate admits requests for at most its cells): logged with the pool."""
        message = error.get("message", error) if isinstance(error, dict) else error
        if 400 <= status < 500:
            return InvalidRequest(f"model {self.name!r}: {message}", param=param)
        self.runner_failures += 1
        log.error("model %s: the runner failed a request (%d): %s", self.name, status, message)
        if "Context size has been exceeded" in str(message):
            log.error(
                "model %s: its KV pool overflowed: %s cells, %d open requests holding %d "
                "(%s); a bug of ours",
                self.name,
                self.pool.cells if self.pool is not None else "?",
                len(self.open_cells),
                sum(self.open_cells.values()),
                sorted(self.open_cells.values()),
            )
        return RunnerFailed(
            f"model {self.name!r}'s runner failed the request: {message}; retry", retry_after=1
        )

    def _stopped(self, exc: Exception) -> RunnerStopped:
        code = self.exited()
        said = self._runner.last_words() if self._runner is not None else ""
        why = f"exited with {code}" if code is not None else f"did not answer ({exc!r})"
        if self._ended_because is not None:
            why = f"was ended: {self._ended_because}"
        log.error("model %s: the runner %s: %s", self.name, why, said)
        return RunnerStopped(
            f"model {self.name!r}'s runner {why}; it is reloaded on the next request",
            retry_after=1,
        )

    def card(self) -> ModelCard:
        facts = self.facts()
        return replace(
            super().card(),
            architecture=facts.architecture,
            format="gguf",
            quantization=facts.quantization,
            # what one request may hold: the pool's, once loaded (it may have shrunk to fit)
            context_length=self.context if self.pool is not None else self._context_for(facts),
        )

    def describe(self) -> dict[str, Any]:
        footprint = self._footprint
        return {
            **super().describe(),
            "path": str(self.path),
            "context": self.context,  # the cells one request may hold
            "kv_cells": self.pool.cells if self.pool is not None else None,
            "parallel": self.pool.slots if self.pool is not None else self.spec.parallel,
            "kv_cache_type": self.spec.kv_cache_type,
            "prefix_cache": self.spec.prefix_cache,  # its slots' prompt cache
            "prompt_cache_ram_bytes": self.prompt_cache_ram(),  # host RAM it may fill
            "runner_pid": self.runner_pid,
            # which build of llama.cpp (cpu, cuda, ...), and those that could not load here
            "engine_build": self._runner.build_view() if self._runner is not None else None,
            "runner_ended_because": self._ended_because,
            "runner_failures": self.runner_failures,
            "split": self.split.describe() if self.split is not None else None,
            "measured": {
                "device_bytes": footprint.device_bytes,
                "host_bytes": footprint.host_bytes,
                "device": footprint.device,
                "host": footprint.host,
            },
        }
