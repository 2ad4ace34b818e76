"""Choosing the device from the settings: simulated, the CPU, or a CUDA GPU, with the
reason when a GPU that is present cannot be used."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from app.config.settings import Settings
from app.devices.base import Device
from app.devices.cpu import CpuDevice
from app.devices.cuda import CudaDevice
from app.devices.nvml import _safe_pynvml, nvidia_gpus
from app.devices.simulated import SimulatedDevice
from app.errors import DeviceUnavailable

log = logging.getLogger("vramgate.device")


CPU_ONLY_TORCH = (
    "an NVIDIA GPU ({gpus}) is present but this PyTorch is a CPU-only build, so vramgate "
    "serves on the CPU: install PyTorch's CUDA build from PyTorch's own package index (the "
    "install page, docs/install.md, says how) and restart"
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
    takes every CUDA device this torch has kernels for when a driver and a GPU exist, and
    otherwise the CPU, saying why; `cuda:N` (or `cuda:0,1`) that cannot be had is
    DeviceUnavailable. `nvml`, `cuda` and `visible` (CUDA_VISIBLE_DEVICES) are parameters
    for tests."""
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
    return _auto_gpus(nvml, cuda, visible)


def _cuda_device(index: int, spec: str, nvml: Any, cuda: Any, visible: str | None) -> Device:
    try:
        device = CudaDevice(index, nvml=nvml, cuda=cuda, visible=visible)
    except DeviceUnavailable:
        raise
    except Exception as exc:  # NVML errors, no CUDA in this torch, no driver
        raise DeviceUnavailable(f"device {spec!r} cannot be used: {exc}") from exc
    lacking = no_kernels(device, cuda)
    if lacking:
        raise DeviceUnavailable(f"device {spec!r} cannot be used: {lacking}")
    return device


def _auto_gpus(nvml: Any, cuda: Any, visible: str | None) -> list[Device]:
    """`auto`: every GPU that can be used; one that cannot is skipped, saying why (a GPU
    this torch has no kernels for also in the devices' warnings); none: the CPU."""
    try:
        count = (cuda if cuda is not None else torch.cuda).device_count()
        first = CudaDevice(0, nvml=nvml, cuda=cuda, visible=visible)
    except Exception as exc:  # every NVML error too (NVMLError_DriverNotLoaded...)
        return [_cpu_instead(exc, nvml)]
    devices: list[CudaDevice] = []
    skipped: list[str] = []
    for index in range(count):
        try:
            device = (
                first if index == 0 else CudaDevice(index, nvml=nvml, cuda=cuda, visible=visible)
            )
        except Exception as exc:
            log.warning("cuda:%d cannot be used (%s); serving on the others", index, exc)
            continue
        lacking = no_kernels(device, cuda)
        if lacking:
            log.warning("cuda:%d cannot be used: %s", index, lacking)
            skipped.append(f"cuda:{index} is not used: {lacking}")
        else:
            devices.append(device)
    if not devices:
        return [_cpu_instead(RuntimeError("; ".join(skipped)), nvml, tuple(skipped))]
    for device in devices:
        device.warnings = (*device.warnings, *skipped)
    if len(devices) > 1:
        log.info("serving on %d GPUs: %s", len(devices), [d.name for d in devices])
    return list(devices)


def no_kernels(device: CudaDevice, cuda: Any = None) -> str | None:
    """Why this torch cannot run on `device`, if it has no kernels for it. torch only
    warns (torch.cuda._check_capability) and the first kernel then fails with 'no kernel
    image is available for execution on the device'. Its rule
    (torch.cuda._code_compatible_with_device): code built for sm_XY runs on a GPU of the
    same major version and a minor version at least Y; we also count PTX (compute_XY),
    which the driver compiles for any newer GPU."""
    arch_list = list((cuda if cuda is not None else torch.cuda).get_arch_list())
    if not arch_list:  # a build that does not say (ROCm): let torch try
        return None
    major, minor = device.capability
    have = major * 10 + minor
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        code = int(number.removesuffix("a").removesuffix("f"))
        if (code // 10 == major and code <= have) or (kind == "compute" and code <= have):
            return None
    return (
        f"{device.name} (sm_{have}): this PyTorch has no kernels for sm_{have}, only for "
        f"{' '.join(arch_list)}; install a PyTorch CUDA build that includes it (the "
        "install page, docs/install.md, says how)"
    )


def _cpu_instead(exc: Exception, nvml: Any, skipped: tuple[str, ...] = ()) -> Device:
    gpus = nvidia_gpus(nvml) if nvml is not None else []
    if skipped:  # GPUs this torch has no kernels for
        warning = f"{'; '.join(skipped)}; serving on the CPU"
        log.warning("%s", warning)
        return CpuDevice(warnings=(warning,))
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
