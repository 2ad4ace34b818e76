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
    """The first of the devices the settings ask for (see `make_devices`)."""
    return make_devices(settings, nvml=nvml, cuda=cuda, visible=visible)[0]


def make_devices(
    settings: Settings, *, nvml: Any = None, cuda: Any = None, visible: str | None = None
) -> list[Device]:
    """The devices the settings ask for, each with a pool and a gate of its own: `auto`
    takes every CUDA device when a driver and a GPU exist, and otherwise the CPU, saying
    why; `cuda:N` (or `cuda:0,1`) that cannot be had is DeviceUnavailable. `nvml`, `cuda`
    and `visible` (CUDA_VISIBLE_DEVICES) are parameters for tests."""
    spec = settings.device
    capacities = settings.simulated_capacities()
    if capacities:
        return [SimulatedDevice(size, index) for index, size in enumerate(capacities)]
    if spec == "cpu":
        return [CpuDevice()]
    nvml = nvml if nvml is not None else _safe_pynvml()
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # CUDA's own variable, read as CUDA does
    if spec.startswith("cuda"):
        indices = [int(i) for i in (spec.partition(":")[2] or "0").split(",")]
        return [_cuda_device(index, spec, nvml, cuda, visible) for index in indices]
    try:
        first = CudaDevice(0, nvml=nvml, cuda=cuda, visible=visible)
    except Exception as exc:  # every NVML error too (NVMLError_DriverNotLoaded...)
        return [_cpu_instead(exc, nvml)]
    return [first, *_other_gpus(first, nvml, cuda, visible)]


def _cuda_device(index: int, spec: str, nvml: Any, cuda: Any, visible: str | None) -> Device:
    try:
        return CudaDevice(index, nvml=nvml, cuda=cuda, visible=visible)
    except DeviceUnavailable:
        raise
    except Exception as exc:  # NVML errors, no CUDA in this torch, no driver
        raise DeviceUnavailable(f"device {spec!r} cannot be used: {exc}") from exc


def _other_gpus(first: CudaDevice, nvml: Any, cuda: Any, visible: str | None) -> list[Device]:
    """`auto`'s GPUs after the first; one that cannot be used is skipped, saying why."""
    others: list[Device] = []
    count = (cuda if cuda is not None else torch.cuda).device_count()
    for index in range(1, count):
        try:
            others.append(CudaDevice(index, nvml=nvml, cuda=cuda, visible=visible))
        except Exception as exc:
            log.warning("cuda:%d cannot be used (%s); serving on the others", index, exc)
    if others:
        log.info("serving on %d GPUs: %s", 1 + len(others), [first.name] + [d.name for d in others])
    return others


def _cpu_instead(exc: Exception, nvml: Any) -> Device:
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
