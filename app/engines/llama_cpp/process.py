"""A model runner in a process of its own: started, supervised, measured and ended.

The runner is a child (app.engines.llama_cpp.runner_main) that prints one JSON line when its model
is loaded and lives until its stdin closes. This side starts it, reads its stderr (the
engine's log, where llama.cpp states every buffer it allocated), reports its exit, and
ends it: stdin closed, then a kill after a grace period. There is no respawn loop: a
runner that dies is reported, and the next request reloads it (crash-only).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

from app.engines.llama_cpp import engine_builds
from app.engines.llama_cpp.engine_builds import EngineBuild
from app.models.base import LoadOutOfMemory
from app.process.job_object import popen_held

log = logging.getLogger("vramgate.runner")

MiB = 2**20
LOG_LINES_KEPT = 200

# llama.cpp's own log lines (llama-model.cpp, llama-context.cpp, llama-kv-cache.cpp):
#   load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
#   llama_kv_cache:      CUDA0 KV buffer size =    45.00 MiB
#   sched_reserve:       CUDA0 compute buffer size =    15.64 MiB
#   llama_context:  CUDA_Host  output buffer size =     0.38 MiB
#   load_tensors: offloaded 30/31 layers to GPU
_BUFFER = re.compile(r"\b(\S+)\s+(model|KV|compute|output|RS) buffer size\s*=\s*([\d.]+) MiB")
_LISTENING = "listening on"  # server.cpp's last load line: "srv init: listening on ..."
LOG_CATCH_UP_S = 2.0
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
# speculative decoding's n-gram pool, in host memory (common/speculative.cpp):
#   spec common_specu: - mod size=4194304 (16.000 MB)
_NGRAM_POOL = re.compile(r"\bmod size=\d+ \(([\d.]+) MB\)")
# the rows of logits a batch may output, and a row's floats (src/llama-context.cpp,
# llama-model.cpp):
#   llama_context: n_outputs_max         = 512
#   print_info: n_vocab               = 49152
_OUTPUTS_MAX = re.compile(r"\bn_outputs_max\s*=\s*(\d+)")
_VOCAB = re.compile(r"\bn_vocab\s*=\s*(\d+)")
LOGIT_BYTES = 4  # float32
# a draft model llama.cpp could not pair with its target: it then serves without
# speculating (tools/server/server-context.cpp's load_model; its reason from
# common/speculative.cpp, as xllamacpp 2026.10 logged it here for a draft of another
# vocabulary):
#   E spec common_specu: the target and draft vocabs are not compatible
#   E srv    load_model: failed to initialize speculative decoding context: draft model
#     vocab type must match target model to use speculation
_SPECULATION_FAILED = re.compile(r"failed to initialize speculative decoding context: (.*)$")


# llama.cpp's words for an allocation of a load that failed: its weights, KV cache or
# compute buffers found no room (a 1.4 TB KV cache asked of this machine's RAM logged
# the first three, then the fourth). Sources: ggml.c ggml_aligned_malloc "insufficient
# memory (attempted to allocate %6.2f MB)"; ggml-backend.cpp and ggml-alloc.c "failed to
# allocate %s buffer of size %zu"; llama-kv-cache.cpp "failed to allocate buffer for kv
# cache"; llama-model.cpp "unable to allocate %s buffer"; llama-context.cpp "failed to
# allocate compute pp buffers" (and tg); ggml-cuda.cu "allocating %.2f MiB on device %d:
# cudaMalloc failed: %s" with cudaGetErrorString's "out of memory".
OUT_OF_MEMORY = re.compile(
    r"insufficient memory \(attempted to allocate|failed to allocate \S+ buffer of size|"
    r"failed to allocate buffer for kv cache|unable to allocate \S+ buffer|"
    r"failed to allocate compute (?:pp|tg) buffers|cudaMalloc failed: out of memory"
)

# The build that imported, for each list of builds tried: later runners start on it at
# once (a build that failed cannot import later in this process's life either).
_WORKING: dict[tuple[EngineBuild, ...], EngineBuild] = {}


class RunnerFailed(RuntimeError):
    """A runner that could not start, or ended; the message has the engine's last words."""


class RunnerOutOfMemory(RunnerFailed, LoadOutOfMemory):
    """A runner whose load ran out of memory (`OUT_OF_MEMORY` in its log)."""


class EngineUnavailable(RunnerFailed):
    """llama.cpp's engine (xllamacpp) cannot be imported here at all: no runner of any
    model can start in this process's life (the message says why and what to do)."""


@dataclass(frozen=True)
class Footprint:
    """What a runner allocated, as its engine reported it: bytes on the accelerator and
    in host memory by what they hold, and how many layers went to the accelerator."""

    device: dict[str, int]  # "model" | "KV" | "compute" | "output" | "ngram" → bytes
    host: dict[str, int]
    layers_on_device: int = 0
    layers: int = 0
    speculation_failed: str | None = None  # llama.cpp's reason, where it could not speculate

    @property
    def device_bytes(self) -> int:
        return sum(self.device.values())

    @property
    def host_bytes(self) -> int:
        return sum(self.host.values())


def footprint_of(lines: list[str]) -> Footprint:
    """The buffers a llama.cpp load logged (a reload logs them again: the last load wins,
    which the caller ensures by reading one process's log): the model's, and a draft
    model's beside it (its own weights, KV, compute and output buffers, logged the same
    way after the model's)."""
    device: dict[str, int] = {}
    host: dict[str, int] = {}
    on_device = layers = vocab = 0
    outputs: list[list[int]] = []  # each context's: its most output bytes, those logged
    failed = None
    for line in lines:
        if (found := _BUFFER.search(line)) is not None:
            name, what, mib = found.groups()
            on_host = name.startswith("CPU") or name.endswith("_Host")
            book = host if on_host else device
            book[what] = book.get(what, 0) + int(float(mib) * MiB)
            if what == "output" and outputs:
                outputs[-1][1] += int(float(mib) * MiB)
        elif (offloaded := _OFFLOADED.search(line)) is not None and not outputs:
            on_device, layers = int(offloaded.group(1)), int(offloaded.group(2))
        elif (pool := _NGRAM_POOL.search(line)) is not None:
            host["ngram"] = host.get("ngram", 0) + int(float(pool.group(1)) * MiB)
        elif (most := _OUTPUTS_MAX.search(line)) is not None:
            outputs.append([int(most.group(1)) * vocab * LOGIT_BYTES, 0])
        elif (words := _VOCAB.search(line)) is not None:
            vocab = int(words.group(1))
        elif (refused := _SPECULATION_FAILED.search(line)) is not None:
            failed = refused.group(1).strip()
    _grown_outputs(device, host, sum(max(0, most - logged) for most, logged in outputs))
    return Footprint(device, host, on_device, layers, failed)


def _grown_outputs(device: dict[str, int], host: dict[str, int], growth: int) -> None:
    """The output buffers as they grow: llama.cpp allocates a context's at load for a row
    of logits a slot (its log's figure) and reallocates it, in the same place, when a
    batch outputs more rows (`output_reserve`), up to its `n_outputs_max` rows: `growth`,
    over every context (a draft model's outputs a row a slot, and grows by none). A
    speculating runner's batch outputs each slot's draft (SmolLM2-135M, 32 slots, drafts
    of 24: 6.00 MiB logged, 512 rows of 49,152 floats, 96 MiB, once drafts run; measured
    here at 4 slots: the process grew 28 MiB more than without drafts while it drafted)."""
    book = device if "output" in device else host
    if growth > 0:
        book["output"] = book.get("output", 0) + growth


def engine_unavailable_text(error: str) -> str:
    """Why no GGUF model can load, and what to do, from the runner's import error."""
    text = f"llama.cpp's engine (xllamacpp) cannot load here: {error}"
    if "DLL load failed" in error or "libcuda" in error:
        text += (
            ". Its CUDA build needs the NVIDIA driver (nvcuda.dll, libcuda): install the "
            "driver, or install xllamacpp's CPU build in its place; GGUF models are "
            "refused until then, every other model is served"
        )
    return text


def runner_argv(module: str, frozen_command: str) -> list[str]:
    """How to start a runner: this interpreter on `module`, or the bundle's own
    executable with `frozen_command` (app.cli dispatches it)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, frozen_command]
    return [sys.executable, "-m", module]


class RunnerProcess:
    """One runner: `start` blocks until its model is loaded (or it failed)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        builds: tuple[EngineBuild, ...] | None = None,
    ) -> None:
        self.name = name
        self._argv = argv
        self._env = env
        # the engine's builds to try in order (app.engines.llama_cpp.engine_builds)
        self._builds = engine_builds.builds_here() if builds is None else builds
        self.build: EngineBuild | None = None  # the one it runs on, once started
        self._not_loaded: list[dict[str, str]] = []  # the builds that could not import
        self._proc: subprocess.Popen[str] | None = None
        self._lines: collections.deque[str] = collections.deque(maxlen=LOG_LINES_KEPT)
        # the load's log, kept whole until the model serves (then its footprint is read)
        self._load_lines: list[str] | None = []
        self._listening = threading.Event()
        self._footprint = Footprint({}, {})
        self._lock = threading.Lock()  # guards both line lists (reader thread vs callers)
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, config: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Start the runner and hand it `config`; returns its ready line. A build of the
        engine that cannot be imported here is left for the next (the CPU build a bundle
        carries beside its CUDA build, for a PC without the NVIDIA driver)."""
        ready = self._start_on_a_build(config, timeout_s)
        if ready.get("engine") is False:
            self.stop(grace_s=1.0)
            raise EngineUnavailable(engine_unavailable_text(str(ready.get("error"))))
        if "address" not in ready:
            self.stop(grace_s=1.0)
            raise self._failed(f"{ready.get('error', 'the runner failed')}: {self.last_words()}")
        # stderr is another pipe: its last load lines may come just after the ready line
        self._listening.wait(LOG_CATCH_UP_S)
        with self._lock:
            self._footprint = footprint_of(self._load_lines or [])
            self._load_lines = None
        return ready

    def _start_on_a_build(self, config: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The ready line of a runner on the first build that imports (or the last
        build's refusal)."""
        builds = self._builds
        order: list[EngineBuild | None] = [_WORKING[builds]] if builds in _WORKING else []
        order = order or [*builds] or [None]
        frozen = bool(getattr(sys, "frozen", False))
        ready: dict[str, Any] = {}
        for build in order:
            if self._proc is not None:  # the build before could not import
                self.stop(grace_s=1.0)
                log.warning("%s: trying llama.cpp's %s build", self.name, build and build.kind)
            argv = build.runner_argv(self._argv, frozen) if build is not None else self._argv
            ready = self._launch(argv, config, timeout_s)
            if ready.get("engine") is not False:
                self.build = build
                if build is not None:
                    _WORKING[builds] = build
                return ready
            if build is not None:
                self._not_loaded.append({"kind": build.kind, "error": str(ready.get("error"))})
        return ready

    def build_view(self) -> dict[str, Any]:
        """Which build of llama.cpp it runs on, and those that could not load first
        (for /status)."""
        return {"kind": self.build.kind if self.build else None, "not_loaded": self._not_loaded}

    def _launch(self, argv: list[str], config: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """A runner started with `argv` and handed `config`; its ready line."""
        env = {**os.environ, **(self._env or {})}
        with self._lock:
            self._load_lines = []
        self._listening.clear()
        # held by the server's job on Windows: ends with the server however it ends
        self._proc = popen_held(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            env=env,
        )
        self._reader = threading.Thread(
            target=self._read_log, name=f"runner-log-{self.name}", daemon=True
        )
        self._reader.start()
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(config) + "\n")
        self._proc.stdin.flush()
        return self._ready_line(timeout_s)

    def _ready_line(self, timeout_s: float) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        stdout = self._proc.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=timeout_s)
        except queue.Empty:
            self.stop(grace_s=1.0)
            raise RunnerFailed(f"the runner did not load within {timeout_s:.0f} s") from None
        if not line:
            code = self._proc.wait()
            raise self._failed(f"the runner exited with {code}: {self.last_words()}")
        found = json.loads(line)
        return found if isinstance(found, dict) else {}

    def _read_log(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for raw in self._proc.stderr:
            line = raw.rstrip()
            with self._lock:
                self._lines.append(line)
                if self._load_lines is not None:
                    self._load_lines.append(line)
                    if _LISTENING in line:
                        self._listening.set()
            log.debug("%s: %s", self.name, line)

    def footprint(self) -> Footprint:
        """What the load allocated, as its log said by the time the model served."""
        return self._footprint

    def load_log(self) -> list[str]:
        """The engine's log lines of the load under way (none once it serves)."""
        with self._lock:
            return list(self._load_lines or [])

    def _failed(self, message: str) -> RunnerFailed:
        """Its load's failure: out of memory where the engine said that an allocation of
        the load failed."""
        with self._lock:
            out_of_memory = any(OUT_OF_MEMORY.search(line) for line in self._lines)
        return (RunnerOutOfMemory if out_of_memory else RunnerFailed)(message)

    def last_words(self, count: int = 8) -> str:
        """The engine's last log lines, for an error message."""
        with self._lock:
            tail = [line for line in self._lines if line.strip()][-count:]
        return " | ".join(tail) or "no output"

    def exited(self) -> int | None:
        """Its exit code once it ended, else None."""
        return None if self._proc is None else self._proc.poll()

    def kill(self) -> None:
        """End it at once (SIGKILL): a runner that stopped answering."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.kill()

    def stop(self, grace_s: float = 5.0) -> None:
        """End it: stdin closed (it unloads and exits), killed if it has not within
        `grace_s`. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                assert proc.stdin is not None
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=2.0)
        for pipe in (proc.stdout, proc.stderr, proc.stdin):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):
                    pipe.close()
