"""How many of a GGUF model's layers go to the GPU: all when they fit, else the layers
that fit beside the KV cells and compute buffers, the rest on the CPU (as Ollama and LM
Studio split a model larger than VRAM). Pure: numbers in, a split out.

llama.cpp offloads the last `n` repeating layers (`n_gpu_layers`), and with all of them
the output head (`n_gpu_layers` = layers + 1); each offloaded layer also holds its KV
cells on the GPU. The compute buffer is priced from the model's width before it is
measured: llama.cpp sizes it for one micro-batch (512 tokens) of activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.engines.gguf_facts import GgufFacts

UBATCH = 512  # llama.cpp's default micro-batch (n_ubatch), what its compute buffer holds
ACTIVATION_FLOATS = 16  # float32 activations per width element per token, a margin on it


@dataclass(frozen=True)
class LayerSplit:
    layers: int  # the model's repeating layers
    on_device: int  # of those, on the GPU
    device_bytes: int  # what the split holds on the device (CPU: all of it, in RAM)
    accelerator: bool

    @property
    def gpu_layers_arg(self) -> int:
        """llama.cpp's n_gpu_layers for this split (layers + 1 also takes the head)."""
        if not self.accelerator:
            return 0
        return self.layers + 1 if self.on_device >= self.layers else self.on_device

    @property
    def gpu_share(self) -> float:
        return self.on_device / self.layers if self.layers else 1.0

    def describe(self) -> str:
        """As Ollama's `ps` says it: "100% GPU", "100% CPU" or "48%/52% CPU/GPU"."""
        if not self.accelerator or self.on_device == 0:
            return "100% CPU"
        if self.on_device >= self.layers:
            return "100% GPU"
        gpu = round(100 * self.gpu_share)
        return f"{100 - gpu}%/{gpu}% CPU/GPU"


def compute_bytes(facts: GgufFacts) -> int:
    """A prior for the compute buffer (SmolLM2-135M: 18.0 MiB priced, 15.6 MiB logged)."""
    return UBATCH * max(facts.width, 1) * 4 * ACTIVATION_FLOATS


def bytes_on_device(facts: GgufFacts, on_device: int, kv_type: str, cells: int) -> int:
    """The device bytes of `on_device` layers (the last ones), their KV cells, the head
    when every layer is there, and the compute buffer."""
    if on_device <= 0:
        return 0
    blocks = sum(facts.layer_bytes[facts.layers - on_device :])
    head = facts.other_bytes if on_device >= facts.layers else 0
    kv = facts.kv_bytes_per_token(kv_type, on_device) * cells
    return blocks + head + kv + compute_bytes(facts)


def plan_split(
    facts: GgufFacts,
    *,
    kv_type: str,
    cells: int,
    accelerator: bool,
    free_bytes: int | None,
    gpu_layers: int | Literal["auto"] = "auto",
    scale: float = 1.0,
) -> LayerSplit:
    """The split for a load: on the CPU everything is in RAM; on a GPU the layers asked
    for, or (auto) as many as fit in `free_bytes` (None: all). `scale`: what loads of
    this model measured against this estimate (learned), applied to every layer count."""

    def held(count: int) -> int:
        return round(bytes_on_device(facts, count, kv_type, cells) * scale)

    every = facts.layers
    if not accelerator:
        whole = sum(facts.layer_bytes) + facts.other_bytes
        total = whole + facts.kv_bytes_per_token(kv_type) * cells + compute_bytes(facts)
        return LayerSplit(every, 0, round(total * scale), accelerator=False)
    if gpu_layers != "auto":
        count = max(0, min(int(gpu_layers), every))
        return LayerSplit(every, count, held(count), True)
    count = every
    while count > 0 and free_bytes is not None and held(count) > free_bytes:
        count -= 1
    return LayerSplit(every, count, held(count), True)
