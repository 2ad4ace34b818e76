"""On the CPU, a generation model runs in the fastest dtype this machine offers, measured
at load: decode steps of the model in float32 and of a bfloat16 copy, in turns, the
faster kept (bfloat16 only by a clear margin: it is less exact). Measured on a 2-core AVX-512 (with
avx512_bf16) machine: SmolLM2-135M 42 ms a token in float32, 27 ms in bfloat16; a tiny
matmul alone was 12x slower in bfloat16 there, so the model itself is what is timed."""

from __future__ import annotations

import copy
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import psutil
import torch

log = logging.getLogger("vramgate.causal_lm")

BF16_MARGIN = 1.25  # bfloat16 is kept only this much faster than float32
STEPS = 12  # decode steps of each dtype timed, in turns (after two unmeasured rounds)
COPY_SHARE = 0.25  # the bfloat16 copy is tried only where it takes this share of free RAM


def faster_dtype(seconds: dict[str, float], margin: float = BF16_MARGIN) -> str:
    """float32, unless bfloat16's step is `margin` times faster. Pure."""
    fp32, bf16 = seconds.get("float32"), seconds.get("bfloat16")
    if fp32 is None or bf16 is None or bf16 <= 0:
        return "float32"
    return "bfloat16" if fp32 / bf16 >= margin else "float32"


def decode_step(
    model: Any, ids: list[int], cache_arg: str = "past_key_values"
) -> Callable[[], float]:
    """After a prefill of `ids`, a function that runs one decode step of the model (its
    own one-token forward with its cache, as generation runs it) and returns its seconds."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
    cache = [getattr(out, cache_arg, None)]
    token = torch.tensor([[ids[-1]]])

    def step() -> float:
        with torch.inference_mode():
            started = time.perf_counter()
            out = model(input_ids=token, use_cache=True, **{cache_arg: cache[0]})
            elapsed = time.perf_counter() - started
        cache[0] = getattr(out, cache_arg, None)
        return elapsed

    return step


def interleaved_seconds(
    steps: dict[str, Callable[[], float]], rounds: int = STEPS
) -> dict[str, float]:
    """Each step's median seconds, the steps run in turns (two unmeasured rounds first):
    a burst of other work on a busy machine slows both alike, where timing one dtype's
    steps and then the other's let it fall on one (a tiny model's float32/bfloat16 ratio
    read 0.12 to 4.12 that way while the test suite ran beside it)."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for turn in range(rounds + 2):
        for name, step in steps.items():
            elapsed = step()
            if turn >= 2:
                times[name].append(elapsed)
    return {name: statistics.median(measured) for name, measured in times.items()}


def fastest_on_cpu(model: Any, ids: list[int], cache_arg: str) -> tuple[Any, str]:
    """The model (loaded in float32) in the faster dtype, and that dtype's name."""
    size = sum(p.numel() for p in model.parameters()) * 2  # its bfloat16 copy
    if size > COPY_SHARE * psutil.virtual_memory().available:
        return model, "float32"  # no room to try: float32, as it was loaded
    candidate = copy.deepcopy(model).to(torch.bfloat16)
    steps = {"float32": decode_step(model, ids, cache_arg)}
    steps["bfloat16"] = decode_step(candidate, ids, cache_arg)
    seconds = interleaved_seconds(steps)
    chosen = faster_dtype(seconds)
    log.info(
        "a decode step on this CPU: float32 %.1f ms, bfloat16 %.1f ms; running in %s",
        seconds["float32"] * 1000,
        seconds["bfloat16"] * 1000,
        chosen,
    )
    if chosen == "bfloat16":
        return candidate, chosen
    del candidate
    return model, "float32"
