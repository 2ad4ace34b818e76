"""On the CPU, a generation model runs in the fastest dtype this machine offers, measured
at load: one decode step of the model in float32 and of a bfloat16 copy, the faster kept
(bfloat16 only by a clear margin: it is less exact). Measured on a 2-core AVX-512 (with
avx512_bf16) machine: SmolLM2-135M 42 ms a token in float32, 27 ms in bfloat16; a tiny
matmul alone was 12x slower in bfloat16 there, so the model itself is what is timed."""

from __future__ import annotations

import copy
import logging
import statistics
import time
from typing import Any

import psutil
import torch

log = logging.getLogger("vramgate.causal_lm")

BF16_MARGIN = 1.25  # bfloat16 is kept only this much faster than float32
STEPS = 6  # decode steps timed (after two unmeasured ones)
COPY_SHARE = 0.25  # the bfloat16 copy is tried only where it takes this share of free RAM


def faster_dtype(seconds: dict[str, float], margin: float = BF16_MARGIN) -> str:
    """float32, unless bfloat16's step is `margin` times faster. Pure."""
    fp32, bf16 = seconds.get("float32"), seconds.get("bfloat16")
    if fp32 is None or bf16 is None or bf16 <= 0:
        return "float32"
    return "bfloat16" if fp32 / bf16 >= margin else "float32"


def step_seconds(model: Any, ids: list[int], cache_arg: str = "past_key_values") -> float:
    """The median time of one decode step after a prefill of `ids` (the model's own
    one-token forward with its cache, as generation runs it)."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        cache = getattr(out, cache_arg, None)
        token = torch.tensor([[ids[-1]]])
        times = []
        for _ in range(STEPS + 2):
            started = time.perf_counter()
            out = model(input_ids=token, use_cache=True, **{cache_arg: cache})
            times.append(time.perf_counter() - started)
            cache = getattr(out, cache_arg, None)
    return statistics.median(times[2:])


def fastest_on_cpu(model: Any, ids: list[int], cache_arg: str) -> tuple[Any, str]:
    """The model (loaded in float32) in the faster dtype, and that dtype's name."""
    size = sum(p.numel() for p in model.parameters()) * 2  # its bfloat16 copy
    if size > COPY_SHARE * psutil.virtual_memory().available:
        return model, "float32"  # no room to try: float32, as it was loaded
    seconds = {"float32": step_seconds(model, ids, cache_arg)}
    candidate = copy.deepcopy(model).to(torch.bfloat16)
    seconds["bfloat16"] = step_seconds(candidate, ids, cache_arg)
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
