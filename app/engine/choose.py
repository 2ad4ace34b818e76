"""Choosing the device from the settings: simulated, the CPU, or a CUDA GPU, with the
reason when a GPU that is present cannot be used."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from app.engine.cuda import CudaDevice
from app.engine.device import CpuDevice, Device, SimulatedDevice
from app.engine.nvml import _safe_pynvml, nvidia_gpus
from app.errors import DeviceUnavailable
from app.settings import Settings

log = logging.getLogger("vramgate.device")


CPU_ONLY_TORCH = (
    "an NVIDIA GPU ({gpus}) is present but this PyTorch is a CPU-only build, so vramgate "
    "serves on the CPU: install PyTorch's CUDA build from PyTorch's own package index (the "
    "README's set-up section says how) and restart"
)


def make_device(
    settings: Settings, *, nvml: Any = None, cuda: Any = None, visible: str | None = None
) -> Device:
    """The device the settings ask for; `auto` takes CUDA when a driver and GPU exist,
    and otherwise the CPU, saying why. `cuda:N` that cannot be had is DeviceUnavailable.
    `nvml`, `cuda` and `visible` (CUDA_VISIBLE_DEVICES) are parameters for tests."""
    spec = settings.device
    capacity = settings.simulated_capacity()
    if capacity is not None:
        return SimulatedDevice(capacity)
    if spec == "cpu":
        return CpuDevice()
    nvml = nvml if nvml is not None else _safe_pynvml()
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # CUDA's own variable, read as CUDA does
    if spec.startswith("cuda"):
        index = int(spec.partition(":")[2] or 0)
        try:
            return CudaDevice(index, nvml=nvml, cuda=cuda, visible=visible)
        except DeviceUnavailable:
            raise
        except Exception as exc:  # NVML errors, no CUDA in this torch, no driver
            raise DeviceUnavailable(f"device {spec!r} cannot be used: {exc}") from exc
    try:
        return CudaDevice(0, nvml=nvml, cuda=cuda, visible=visible)
    except Exception as exc:  # every NVML error too (NVMLError_DriverNotLoaded...)
        gpus = nvidia_gpus(nvml) if nvml is not None else []
        if gpus:  # a GPU the user surely meant us to use: say what stands in the way
            if torch.version.cuda is None:
                warning = CPU_ONLY_TORCH.format(gpus=", ".join(gpus))
            else:
                warning = (
                    f"the NVIDIA GPU ({', '.join(gpus)}) cannot be used ({exc}); serving on the CPU"
                )
            log.warning("%s", warning)
            return CpuDevice(warnings=(warning,))
        log.info("no usable CUDA device (%s: %s); serving on the CPU", type(exc).__name__, exc)
        return CpuDevice()
