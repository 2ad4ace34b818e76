"""A server that cannot start says why in the tray: its output's known causes (the page
file, a DLL, an old driver) become their fix in the tooltip and a notification, where
before the tray said only "the server crashed 5 times within 10s of start"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.live import wait_until
from tray.monitor import Monitor
from tray.start_failures import MISSING_DLL, OLD_DRIVER, PAGE_FILE, VC_RUNTIME, diagnose
from tray.supervisor import RestartPolicy, Supervisor
from tray.view import TOOLTIP_MAX, TrayView, view_of

TORCH_LIB = r"C:\Users\me\AppData\Local\Programs\vramgate\_internal\torch\lib"
# The lines as the server's output carries them. Where each text comes from:
# - WinError 1455/1114/126: Windows' System Error Codes (ERROR_COMMITMENT_LIMIT,
#   ERROR_DLL_INIT_FAILED, ERROR_MOD_NOT_FOUND) as FormatMessage words them, with the
#   suffix torch/__init__.py's _load_dll_libraries adds ('Error loading "{dll}" or one of
#   its dependencies.');
# - "DLL load failed while importing %U: %U": CPython's Python/dynload_win.c (what the
#   bundle's CUDA build of xllamacpp raises without nvcuda.dll: packaging/README.md);
# - "The NVIDIA driver on your system is too old (found version %d)...": torch's
#   c10/cuda/CUDAFunctions.cpp, raised or warned (torch/cuda/__init__.py, "CUDA
#   initialization: ...");
# - "CUDA driver version is insufficient for CUDA runtime version": the CUDA runtime's
#   cudaGetErrorString(cudaErrorInsufficientDriver), as ggml's ggml_cuda_init prints it.
KNOWN_LINES = [
    (
        "OSError: [WinError 1455] The paging file is too small for this operation to "
        f'complete. Error loading "{TORCH_LIB}\\cudnn_cnn64_9.dll" or one of its dependencies.',
        PAGE_FILE,
    ),
    (
        "OSError: [WinError 1114] A dynamic link library (DLL) initialization routine "
        f'failed. Error loading "{TORCH_LIB}\\c10.dll" or one of its dependencies.',
        VC_RUNTIME,
    ),
    (
        "ImportError: DLL load failed while importing xllamacpp: The specified module could "
        "not be found.",
        MISSING_DLL,
    ),
    (
        "OSError: [WinError 126] The specified module could not be found. Error loading "
        f'"{TORCH_LIB}\\shm.dll" or one of its dependencies.',
        MISSING_DLL,
    ),
    (
        "UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found "
        "version 11040). Please update your GPU driver by downloading and installing a new "
        "version from the URL: http://www.nvidia.com/Download/index.aspx Alternatively, go "
        "to: https://pytorch.org to install a PyTorch version that has been compiled with "
        "your version of the CUDA driver.",
        OLD_DRIVER,
    ),
    (
        "ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for "
        "CUDA runtime version",
        OLD_DRIVER,
    ),
]


@pytest.mark.parametrize(("line", "expected"), KNOWN_LINES)
def test_a_known_start_failure_becomes_its_fix_in_the_tooltip_and_a_notification(line, expected):
    output = ["Traceback (most recent call last):", '  File "app\\__main__.py", line 4', line]
    assert diagnose(output) == expected
    view = view_of(
        None,
        supervisor_state="gave_up",
        supervisor_message="the server crashed 5 times within 10s of start",
        restarts=4,
        failure=diagnose(output),
    )
    assert view.icon.state == "error"
    assert view.tooltip == f"vramgate stopped: {expected.cause}; {expected.hint}"
    assert len(view.tooltip) <= TOOLTIP_MAX  # Windows keeps no more
    assert view.notice is not None and expected.fix in view.notice.text
    assert f"Fix: {expected.fix}" in view.lines


def test_an_unknown_failure_says_what_the_supervisor_saw():
    assert diagnose(["Traceback (most recent call last):", "ValueError: bad"]) is None
    view = view_of(
        None,
        supervisor_state="gave_up",
        supervisor_message="the server crashed 5 times within 10s of start",
        failure=None,
    )
    assert view.tooltip == "vramgate: the server crashed 5 times within 10s of start"
    assert view.notice is None


def test_the_page_file_first_where_torch_adds_its_error_loading_line():
    """torch words a page file error as it does a missing DLL: the particular cause wins."""
    assert diagnose([KNOWN_LINES[3][0], KNOWN_LINES[0][0]]) == PAGE_FILE


@pytest.mark.slow
def test_a_server_that_cannot_start_ends_with_its_fix_in_the_trays_tooltip(tmp_path: Path):
    """Through the real supervisor and monitor: a stand-in server that prints the page file
    error (as torch does before it exits) five times; the tray's view says the fix."""
    crash = f"import sys; print({KNOWN_LINES[0][0]!r}); sys.exit(1)"
    supervisor = Supervisor(
        [sys.executable, "-c", crash],
        log_dir=tmp_path / "log",
        pid_file=tmp_path / "pid",
        policy=RestartPolicy(base_s=0.01, cap_s=0.01),
    )
    seen: list[TrayView] = []
    monitor = Monitor("http://127.0.0.1:9", supervisor, lambda view, _: seen.append(view))
    supervisor.start()
    try:
        wait_until(lambda: supervisor.state == "gave_up", 60, "the supervisor gave up")
        view = monitor.poll()
    finally:
        supervisor.stop()
    assert view.tooltip.startswith("vramgate stopped: Windows' page file is too small")
    assert view.notice is not None and "Virtual memory" in view.notice.text
    assert "crashed 5 times" in view.lines[-1]
