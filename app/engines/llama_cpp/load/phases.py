"""The phases of a llama.cpp runner's load, read from the engine's own log as it writes
it (llama-model.cpp, llama-context.cpp, server.cpp; tried with xllamacpp here). Pure:
log lines in, the phase reached out.

A cold GGUF spends its time in the weights (read from disk, copied to the GPU) and, on
the CPU, in the warm-up (the first run touches every mapped page); a large context in
its KV cache; each phase is said as it begins.
"""

from __future__ import annotations

from collections.abc import Iterable

# (what the log line holds, the phase that begins there), in the order a load goes
PHASES: tuple[tuple[str, str], ...] = (
    ("", "starting the runner"),
    ("load_model: loading model", "reading the model's header"),
    ("load_tensors: loading model tensors", "loading the weights"),
    ("llama_context: constructing", "allocating the KV cache"),
    ("sched_reserve: reserving", "reserving compute buffers"),
    ("warming up the model", "warming up"),
    ("load_model: initializing", "starting its slots"),
)


def phase_of(lines: Iterable[str]) -> tuple[int, str]:
    """The phase the log has reached (its place from 1, and its words)."""
    reached = 0
    for line in lines:
        for index in range(reached + 1, len(PHASES)):
            if PHASES[index][0] in line:
                reached = index
                break
    return reached + 1, PHASES[reached][1]
