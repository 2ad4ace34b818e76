"""A device an in-process engine puts torch tensors on: where they go, memory really
held for a simulated model, torch's own out-of-memory error, and torch's thread count.
Every device the server runs on is one (the CPU, a CUDA GPU, the simulated GPU); the
torch-free base (app.devices.base) is all the core and the routes see."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from app.devices.base import Device


class TorchBacked(Device):
    torch_device: torch.device

    @property
    def tensors_on(self) -> str:  # type: ignore[override]  # the base's is a plain "cpu"
        return str(self.torch_device)

    @contextlib.contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """Really occupy `nbytes` on the device for the duration (simulated models)."""
        block = torch.empty(max(0, nbytes), dtype=torch.uint8, device=self.torch_device)
        if self.torch_device.type == "cpu":
            block.fill_(0)  # touch the pages so the RAM is really resident
        with self._held_here(nbytes):
            try:
                yield
            finally:
                del block

    def is_oom(self, exc: BaseException) -> bool:
        """Out of device memory, in any of the forms torch raises it."""
        return isinstance(exc, torch.OutOfMemoryError) or super().is_oom(exc)

    def size_threads(self, cpu_threads: int, slots: int) -> int:
        """On the CPU, concurrent jobs × intra-op threads must not exceed the cores: each
        of `slots` jobs gets its share (or `cpu_threads`). A GPU keeps torch's own."""
        if cpu_threads <= 0:
            if self.torch_device.type != "cpu":
                return torch.get_num_threads()
            cpu_threads = max(1, (os.cpu_count() or 1) // slots)
        torch.set_num_threads(cpu_threads)
        return cpu_threads


def torch_device_of(device: Device) -> torch.device:
    """Where an in-process torch model's tensors go on `device`."""
    assert isinstance(device, TorchBacked), f"{device.id} holds no torch tensors"
    return device.torch_device
