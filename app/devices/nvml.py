"""NVML (the driver's management library, shipped as `pynvml` by nvidia-ml-py): which
NVML device is torch's `cuda:N`, and which NVIDIA GPUs the driver reports."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

log = logging.getLogger("vramgate.device")


def _pynvml() -> Any:
    import pynvml  # the module shipped by nvidia-ml-py

    return pynvml


def nvml_handle_for(nvml: Any, cuda: Any, index: int, visible: str | None) -> Any:
    """The NVML handle of torch's `cuda:index`. NVML numbers GPUs by PCI bus; CUDA orders
    them fastest first and after CUDA_VISIBLE_DEVICES (indices or UUIDs), so the CUDA
    index is matched through the device's UUID or PCI bus id, never used as NVML's."""
    props = cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        with contextlib.suppress(nvml.NVMLError):
            return nvml.nvmlDeviceGetHandleByUUID(
                text if text.startswith("GPU-") else f"GPU-{text}"
            )
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
        with contextlib.suppress(nvml.NVMLError):
            return nvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08X}:{bus:02X}:{device:02X}.0")
    return _handle_from_visible(nvml, index, visible)


def _handle_from_visible(nvml: Any, index: int, visible: str | None) -> Any:
    """Without UUID or bus id from torch: CUDA_VISIBLE_DEVICES names the GPU (a UUID, or
    an NVML index when the order is the bus's), else the only GPU, else a guess."""
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    if index < len(entries):
        entry = entries[index]
        if entry.startswith(("GPU-", "MIG-")):
            return nvml.nvmlDeviceGetHandleByUUID(entry)
        if entry.isdigit():
            index = int(entry)
    if nvml.nvmlDeviceGetCount() == 1:
        return nvml.nvmlDeviceGetHandleByIndex(0)
    log.warning("cannot match cuda:%d to its NVML device; assuming NVML index %d", index, index)
    return nvml.nvmlDeviceGetHandleByIndex(index)


def nvidia_gpus(nvml: Any) -> list[str]:
    """The names of the NVIDIA GPUs the driver reports ([] when none, or no driver)."""
    try:
        nvml.nvmlInit()
        names = []
        for i in range(nvml.nvmlDeviceGetCount()):
            name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names
    except Exception:  # any NVML failure (no driver, driver not loaded...) means none
        return []


def _safe_pynvml() -> Any:
    try:
        return _pynvml()
    except ImportError:
        return None
