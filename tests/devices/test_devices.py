"""Devices: the simulated one's exact accounting and torch's OOM class; the CPU one's
real readings; error classification."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from app.config.settings import load_settings
from app.devices.choose import make_device
from app.devices.cpu import CpuDevice
from app.devices.simulated import SimulatedDevice
from app.errors import DeviceUnavailable

MiB = 2**20


def test_simulated_device_raises_torchs_out_of_memory_and_keeps_its_high_water():
    device = SimulatedDevice(100 * MiB)
    with device.hold(60 * MiB):
        assert device.snapshot().free == 40 * MiB
        with pytest.raises(torch.OutOfMemoryError), device.hold(50 * MiB):
            pass
    assert device.oom_count == 1
    assert device.high_water == 60 * MiB
    assert device.allocated() == 0


def test_simulated_device_counts_other_programs():
    device = SimulatedDevice(100 * MiB)
    device.set_external(70 * MiB)
    snap = device.snapshot()
    assert (snap.used_by_others, snap.free_for_us) == (70 * MiB, 30 * MiB)
    with pytest.raises(torch.OutOfMemoryError), device.hold(40 * MiB):
        pass


def test_simulated_peak_is_resettable_and_thread_safe():
    device = SimulatedDevice(1000 * MiB)
    device.begin_peak()
    barrier = threading.Barrier(4)

    def worker() -> None:
        with device.hold(10 * MiB):
            barrier.wait()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert device.peak() == 40 * MiB
    device.begin_peak()
    assert device.peak() == 0


def test_cpu_device_reads_real_memory_and_measures_a_real_peak():
    """In a fresh process: after the whole suite, this test's own process reused 64 MiB
    of memory torch had already made resident, and its resident set did not grow."""
    import subprocess
    import sys

    code = (
        "from app.devices.cpu import CpuDevice\n"
        "MiB = 2**20\n"
        "device = CpuDevice()\n"
        "snap = device.snapshot()\n"
        "assert snap.total > snap.free > 0 and snap.ours > 0\n"
        "device.begin_peak()\n"
        "base = device.allocated()\n"
        "with device.hold(64 * MiB):\n"
        "    pass\n"
        "print(device.peak() - base)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 60 * MiB


def test_fatal_errors_are_told_from_ordinary_ones():
    device = SimulatedDevice(MiB)
    assert device.is_fatal(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert device.is_fatal(RuntimeError("CUDA error: device-side assert triggered"))
    assert not device.is_fatal(RuntimeError("shape mismatch"))
    assert not device.is_fatal(torch.OutOfMemoryError("CUDA out of memory"))
    assert device.is_oom(torch.OutOfMemoryError("x"))


def test_auto_without_a_driver_serves_on_the_cpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    settings = load_settings({"device": "auto"}, tmp_path / "none.toml")
    assert make_device(settings).kind == "cpu"


def test_cuda_without_a_driver_is_a_settings_error_that_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    settings = load_settings({"device": "cuda:0"}, tmp_path / "none.toml")
    with pytest.raises(DeviceUnavailable, match=r"'cuda:0' cannot be used.*(NVIDIA driver|CUDA)"):
        make_device(settings)


class FakeNvml:
    """Stands in for the NVIDIA driver, which this machine does not have."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    def __init__(self, total: int, free: int, ours: int | None, present: bool = True) -> None:
        self.total, self.free, self.ours, self.present = total, free, ours, present

    # NVML's own order: by PCI bus. (uuid, bus id) of each GPU.
    gpus = (("GPU-aaaa", "00000000:01:00.0"), ("GPU-bbbb", "00000000:02:00.0"))

    def nvmlInit(self) -> None:
        if not self.present:
            raise self.NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        for index, (known, _) in enumerate(self.gpus):
            if known == uuid:
                return f"gpu{index}"
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetHandleByPciBusId(self, bus: str) -> str:
        for index, (_, known) in enumerate(self.gpus):
            if known == bus:
                return f"gpu{index}"
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetName(self, handle: str) -> str:
        return "NVIDIA GeForce RTX 4090"

    def nvmlDeviceGetMemoryInfo(self, handle: str):
        return type("Info", (), {"total": self.total, "free": self.free})()

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str):
        import os

        if self.ours is None:
            raise self.NVMLError("not supported")
        return [type("Proc", (), {"pid": os.getpid(), "usedGpuMemory": self.ours})()]

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"580.00"


class FakeCudaStats:
    """torch.cuda's memory statistics as the CUDA caching allocator reports them, and two
    GPUs that CUDA numbers in another order than NVML."""

    def __init__(self, allocated: int, reserved: int) -> None:
        self.allocated, self.reserved, self.peak = allocated, reserved, allocated
        # CUDA's order (fastest first): cuda:0 is the card on bus 02, NVML's index 1
        self.props = [
            type("Props", (), {"uuid": "bbbb", "pci_bus_id": 2, "pci_device_id": 0})(),
            type("Props", (), {"uuid": "aaaa", "pci_bus_id": 1, "pci_device_id": 0})(),
        ]
        self.capability = (8, 6)
        self.calls: list[str] = []

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return len(self.props)

    def get_device_properties(self, index: int):
        return self.props[index]

    def get_device_capability(self, index: int) -> tuple[int, int]:
        return self.capability

    def get_device_name(self, index: int) -> str:
        return "Fake RTX"

    def get_arch_list(self) -> list[str]:  # torch's CUDA 12.6 wheels (x86_64)
        return ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]

    def synchronize(self, index: int | None = None) -> None:
        self.calls.append("device-wide synchronize")

    def Stream(self, device: int):
        stats = self

        class Stream:
            def synchronize(self) -> None:
                stats.calls.append("stream synchronize")

        return Stream()

    def current_stream(self, index: int):
        return self._current

    def stream(self, stream):
        import contextlib

        @contextlib.contextmanager
        def using():
            self._current = stream
            yield

        return using()

    def memory_allocated(self, index: int) -> int:
        return self.allocated

    def memory_reserved(self, index: int) -> int:
        return self.reserved

    def max_memory_allocated(self, index: int) -> int:
        return self.peak

    def reset_peak_memory_stats(self, index: int) -> None:
        self.peak = self.allocated


def test_fake_driver_cuda_snapshot_counts_cached_memory_as_ours_to_use():
    from app.devices.cuda import CudaDevice

    gib = 2**30
    stats = FakeCudaStats(allocated=2 * gib, reserved=3 * gib)
    device = CudaDevice(
        0, nvml=FakeNvml(total=24 * gib, free=10 * gib, ours=int(3.5 * gib)), cuda=stats
    )
    snap = device.snapshot()
    assert snap.free_for_us == 11 * gib  # driver free + cached but unused
    assert snap.ours == int(3.5 * gib)  # the driver's view includes the CUDA context
    assert snap.used_by_others == int(10.5 * gib)  # 14 used, 3.5 of it ours
    assert device.describe()["driver"] == "580.00" and device.key == "cuda:Fake RTX"


def test_fake_driver_without_per_process_figures_falls_back_to_reserved():
    from app.devices.cuda import CudaDevice

    stats = FakeCudaStats(allocated=100, reserved=300)
    device = CudaDevice(0, nvml=FakeNvml(total=1000, free=500, ours=None), cuda=stats)
    assert device.snapshot().ours == 300 and device.snapshot().used_by_others == 200


def test_fake_driver_missing_means_no_nvidia_driver():
    from app.devices.cuda import CudaDevice

    with pytest.raises(RuntimeError, match="no NVIDIA driver"):
        CudaDevice(0, nvml=FakeNvml(0, 0, None, present=False), cuda=FakeCudaStats(0, 0))


def fake_cuda_device(index: int = 0, visible: str | None = None, **props):
    from app.devices.cuda import CudaDevice

    stats = FakeCudaStats(100, 300)
    for name, value in props.items():
        for prop in stats.props:
            setattr(prop, name, value)
    nvml = FakeNvml(total=1000, free=500, ours=None)
    return CudaDevice(index, nvml=nvml, cuda=stats, visible=visible), stats


def test_the_nvml_handle_is_the_cuda_devices_own_by_uuid():
    """cuda:0 is NVML's GPU 1 here: its free memory must be read from NVML's 1."""
    assert fake_cuda_device(0)[0]._handle == "gpu1"
    assert fake_cuda_device(1)[0]._handle == "gpu0"


def test_the_nvml_handle_is_matched_by_pci_bus_id_without_a_uuid():
    assert fake_cuda_device(0, uuid=None)[0]._handle == "gpu1"


def test_without_uuid_or_bus_id_cuda_visible_devices_names_the_gpu():
    no_ids = {"uuid": None, "pci_bus_id": None}
    assert fake_cuda_device(0, visible="GPU-bbbb", **no_ids)[0]._handle == "gpu1"
    assert fake_cuda_device(0, visible="1", **no_ids)[0]._handle == "gpu1"
    assert fake_cuda_device(1, visible="1,0", **no_ids)[0]._handle == "gpu0"


def test_a_job_waits_for_its_own_stream_not_the_whole_device():
    device, stats = fake_cuda_device(0)
    with device.job_stream():
        device.synchronize()
    assert stats.calls == ["stream synchronize"]
    device.settle()  # after a load: the weights' copies on the loader's stream are done
    assert stats.calls == ["stream synchronize", "device-wide synchronize"]


def test_bf16_only_where_native(tmp_path):
    """torch.cuda.is_bf16_supported() says yes on Turing (7.5), which emulates it."""
    from app.engines.torch.generation.causal_lm import auto_dtype

    device, stats = fake_cuda_device(0)
    stats.capability = (7, 5)
    assert auto_dtype(device, "auto") == "float16"
    stats.capability = (8, 0)
    assert auto_dtype(device, "auto") == "bfloat16"
    assert auto_dtype(device, "float32") == "float32"
    assert auto_dtype(SimulatedDevice(MiB), "auto") == "float32"


def test_a_cuda_index_that_does_not_exist_is_a_settings_error():
    with pytest.raises(DeviceUnavailable, match="cuda:5 does not exist"):
        fake_cuda_device(5)


class DriverNotLoaded(FakeNvml):
    def nvmlInit(self) -> None:
        import pynvml

        # NVML_ERROR_DRIVER_NOT_LOADED (a driver installed, not running), raised as pynvml's
        # _nvmlCheckReturn raises it: NVMLError(code) makes the code's own subclass
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)


def test_auto_falls_back_to_the_cpu_on_any_nvml_error(tmp_path, caplog):
    caplog.set_level("INFO", logger="vramgate.device")
    settings = load_settings({"device": "auto"}, tmp_path / "none.toml")
    device = make_device(settings, nvml=DriverNotLoaded(0, 0, None), cuda=FakeCudaStats(0, 0))
    assert device.kind == "cpu" and "Driver Not Loaded" in caplog.text


class CpuOnlyTorch(FakeCudaStats):
    def is_available(self) -> bool:
        return False


def test_an_nvidia_gpu_with_a_cpu_only_torch_is_a_warning_that_names_the_fix(tmp_path):
    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    settings = load_settings({"device": "auto"}, tmp_path / "none.toml")
    device = make_device(settings, nvml=FakeNvml(1000, 500, None), cuda=CpuOnlyTorch(0, 0))
    assert device.kind == "cpu"
    (warning,) = device.describe()["warnings"]
    assert "RTX 4090" in warning and "CPU-only" in warning and "CUDA build" in warning


# The texts torch raises, as its sources build them (see app/devices/base.py):
# c10/cuda/CUDAException.cpp: "CUDA error: " + cudaGetErrorString(err), then a "Search for"
# line (torch >= 2.8) and the CUDA_LAUNCH_BLOCKING hint; torch >= 2.8 raises these as
# torch.AcceleratorError, a RuntimeError, earlier versions as RuntimeError.
_HINT = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\nFor debugging consider passing "
    "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
    "assertions.\n"
)


def _cuda_error(text: str, code: str) -> str:
    return (
        f"CUDA error: {text}\nSearch for `{code}' in https://docs.nvidia.com/cuda/"
        f"cuda-runtime-api/group__CUDART__TYPES.html for more information.{_HINT}"
    )


OUT_OF_MEMORY = [
    # c10/cuda/CUDACachingAllocator.cpp (the allocator's own OOM: torch.OutOfMemoryError)
    torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "23.99 GiB of which 1.02 GiB is free."
    ),
    # cudaErrorMemoryAllocation from a kernel launch or cudaMemGetInfo
    torch.AcceleratorError(_cuda_error("out of memory", "cudaErrorMemoryAllocation")),
    RuntimeError("CUDA error: out of memory" + _HINT),  # torch < 2.8
    # aten/src/ATen/cuda/Exceptions.h, TORCH_CUDABLAS_CHECK
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
        "`cublasLtMatmulAlgoGetHeuristic( ltHandle, computeDesc.descriptor(), ...)`"
    ),
    # aten/src/ATen/cudnn/Exceptions.h, AT_CUDNN_CHECK
    RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    # aten/src/ATen/native/cuda/MiscUtils.h, TORCH_CUSOLVER_CHECK
    RuntimeError(
        "CUDA error: CUSOLVER_STATUS_ALLOC_FAILED when calling `cusolverDnCreate(handle)`"
    ),
]

FATAL = [
    torch.AcceleratorError(
        _cuda_error("an illegal memory access was encountered", "cudaErrorIllegalAddress")
    ),
    RuntimeError("CUDA error: device-side assert triggered" + _HINT),
    RuntimeError("CUDA error: unspecified launch failure" + _HINT),
    RuntimeError("CUDA error: uncorrectable ECC error encountered" + _HINT),
    RuntimeError("CUDA error: an illegal instruction was encountered" + _HINT),
    RuntimeError("CUDA error: misaligned address" + _HINT),
    RuntimeError("CUDA error: the launch timed out and was terminated" + _HINT),
]

ORDINARY = [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x64 and 32x64)"),
    RuntimeError("an illegal combination of arguments"),  # once matched "an illegal"
    RuntimeError("Expected all tensors to be on the same device, but found cuda:0 and cpu!"),
]


@pytest.mark.parametrize("error", OUT_OF_MEMORY, ids=lambda e: str(e)[:40])
def test_every_form_of_out_of_memory_is_recognised(error):
    device = SimulatedDevice(MiB)
    assert device.is_oom(error) and not device.is_fatal(error)


@pytest.mark.parametrize("error", FATAL, ids=lambda e: str(e)[:40])
def test_fatal_device_errors_are_recognised_from_torchs_texts(error):
    device = SimulatedDevice(MiB)
    assert device.is_fatal(error) and not device.is_oom(error)


@pytest.mark.parametrize("error", ORDINARY, ids=lambda e: str(e)[:40])
def test_ordinary_errors_are_neither(error):
    device = SimulatedDevice(MiB)
    assert not device.is_fatal(error) and not device.is_oom(error)


def test_cpu_peak_without_a_resettable_high_water_mark_is_sampled():
    """Off Linux (Windows, macOS) there is no /proc high-water mark to reset: the peak
    is sampled while the job runs. Taken here through the same interface; a peak read
    only at the job's start and end would see nothing of a tensor freed before its end."""
    device = CpuDevice(sample_peak=True)
    device.begin_peak()
    base = device.allocated()
    with device.hold(256 * MiB):
        time.sleep(0.5)  # a job's working memory, held for a while (a busy machine
        # may leave the 1 ms sampler unscheduled for tens of milliseconds: it missed 50)
    assert device.allocated() - base < 64 * MiB  # given back before the end
    assert device.peak() - base >= 240 * MiB


def test_fake_driver_auto_takes_every_gpu_each_with_its_own_driver_handle(tmp_path, caplog):
    """Two GPUs (CUDA numbers them fastest first, NVML by bus): `auto` takes both, and
    each reads the driver's figures of its own card; a third that CUDA counts but cannot
    describe is skipped, saying why."""
    from app.devices.choose import make_devices

    gib = 2**30
    nvml = FakeNvml(total=24 * gib, free=10 * gib, ours=None)
    auto = load_settings({"device": "auto"}, tmp_path / "none.toml")
    devices = make_devices(auto, nvml=nvml, cuda=FakeCudaStats(0, 0))
    assert [d.id for d in devices] == ["cuda:0", "cuda:1"]
    assert [d._handle for d in devices] == ["gpu1", "gpu0"]  # bus 02 is CUDA's first

    class ThreeCounted(FakeCudaStats):
        def device_count(self) -> int:
            return 3

    caplog.set_level("WARNING", logger="vramgate.device")
    devices = make_devices(auto, nvml=nvml, cuda=ThreeCounted(0, 0))
    assert [d.id for d in devices] == ["cuda:0", "cuda:1"]
    assert "cuda:2 cannot be used" in caplog.text

    named = load_settings({"device": "cuda:1,0"}, tmp_path / "none.toml")
    assert [d.id for d in make_devices(named, nvml=nvml, cuda=FakeCudaStats(0, 0))] == [
        "cuda:1",
        "cuda:0",
    ]
    missing = load_settings({"device": "cuda:0,5"}, tmp_path / "none.toml")
    with pytest.raises(DeviceUnavailable, match="cuda:5 does not exist"):
        make_devices(missing, nvml=nvml, cuda=FakeCudaStats(0, 0))


def test_several_simulated_devices_are_numbered_in_order(tmp_path):
    from app.devices.choose import make_devices

    settings = load_settings({"device": "simulated:8GiB, 4GiB"}, tmp_path / "none.toml")
    devices = make_devices(settings)
    assert [(d.id, d.capacity) for d in devices] == [
        ("simulated:0", 8 * 2**30),
        ("simulated:1", 4 * 2**30),
    ]


class OnePascalOneAmpere(FakeCudaStats):
    """A GTX 1080 (sm_61) beside an RTX 3090 (sm_86), under a torch built for sm_70 and
    later, as torch's CUDA 12.8 wheels are (torch/cuda/__init__.py's
    PYTORCH_RELEASES_CODE_CC; `get_arch_list` reads the build's arch flags)."""

    capabilities = ((6, 1), (8, 6))

    def get_device_capability(self, index: int) -> tuple[int, int]:
        return self.capabilities[index]

    def get_device_name(self, index: int) -> str:
        return ["NVIDIA GeForce GTX 1080", "NVIDIA GeForce RTX 3090"][index]

    def get_arch_list(self) -> list[str]:
        return ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]


def test_auto_skips_a_gpu_this_torch_has_no_kernels_for_and_says_so(tmp_path, caplog):
    """torch itself only warns (torch.cuda._check_capability) and the first kernel on
    that card fails with 'no kernel image is available for execution on the device'."""
    from app.devices.choose import make_devices

    caplog.set_level("WARNING", logger="vramgate.device")
    nvml = FakeNvml(total=8 * 2**30, free=6 * 2**30, ours=None)
    auto = load_settings({"device": "auto"}, tmp_path / "none.toml")
    devices = make_devices(auto, nvml=nvml, cuda=OnePascalOneAmpere(0, 0))
    assert [d.id for d in devices] == ["cuda:1"]
    assert "GTX 1080" in caplog.text and "sm_61" in caplog.text
    (warning,) = devices[0].describe()["warnings"]  # in /status and the tray too
    assert "GTX 1080" in warning and "no kernels" in warning

    class OnlyPascal(OnePascalOneAmpere):
        def device_count(self) -> int:
            return 1

    (cpu,) = make_devices(auto, nvml=nvml, cuda=OnlyPascal(0, 0))
    assert cpu.kind == "cpu" and "GTX 1080" in cpu.describe()["warnings"][0]
    named = load_settings({"device": "cuda:0"}, tmp_path / "none.toml")
    with pytest.raises(DeviceUnavailable, match="no kernels for sm_61"):
        make_devices(named, nvml=nvml, cuda=OnePascalOneAmpere(0, 0))


def test_the_cuda_context_is_no_room_for_models_or_jobs():
    """The driver counts our CUDA context (hundreds of MiB) as our process's; torch's
    allocator never sees it. What models and jobs may ever hold leaves it out, or a
    request that can never fit waits in the queue instead of a 413."""
    from app.core.memory import MemoryView
    from app.devices.cuda import CudaDevice
    from tests.support.fake_cuda import CachingCuda, CardNvml

    gib = 2**30
    card = CachingCuda(total=24 * gib, context=500 * MiB)
    device = CudaDevice(0, nvml=CardNvml(card), cuda=card)
    memory = MemoryView(device, reserve=512 * MiB, clock=time.monotonic)
    assert memory.device_bytes() == 24 * gib - 500 * MiB - 512 * MiB


def test_a_threads_holds_are_counted_apart_from_other_threads():
    """What a simulated generation reports as its cache is what the device counted for
    the holds its own thread entered, not its own arithmetic, and not its neighbours'."""
    device = SimulatedDevice(2**30)
    seen: dict[str, int] = {}
    inside = threading.Barrier(2)

    def hold(name: str, nbytes: int) -> None:
        with device.hold(nbytes), device.hold(nbytes):
            inside.wait(5)
            seen[name] = device.held_by_this_thread()
            inside.wait(5)

    threads = [threading.Thread(target=hold, args=(n, b)) for n, b in (("a", 10), ("b", 300))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {"a": 20, "b": 600}
    assert device.held_by_this_thread() == 0 and device.allocated() == 0


def test_a_hold_let_go_on_another_thread_is_uncounted_for_the_one_that_took_it():
    """A model's weights are held by its loader's thread and let go by its unload's."""
    import contextlib

    device = SimulatedDevice(2**30)
    stack = contextlib.ExitStack()
    taken: list[int] = []

    def load() -> None:
        stack.enter_context(device.hold(100))
        taken.append(device.held_by_this_thread())

    loader = threading.Thread(target=load)
    loader.start()
    loader.join()
    unloader = threading.Thread(target=stack.close)
    unloader.start()
    unloader.join()
    assert taken == [100] and device.allocated() == 0
    assert device.__dict__["_held_by_thread"] == {}
