"""Why the server could not start, read from its own output, and the fix a person can
make: what the tray says when it gives up (its notification and tooltip) instead of only
"crashed 5 times", with the cause left in a log.

Pure: lines in, a `StartFailure` or None out. The table's patterns are the libraries'
and Windows' own words (where each comes from is beside it); the first entry that any
line matches wins, so the more particular causes come first (torch adds "Error loading
...dll" to a page file error as to a missing DLL).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class StartFailure:
    cause: str  # what went wrong, in a few words
    fix: str  # what the person does about it
    hint: str  # the fix in a few words, for the tooltip (127 characters in all)

    def text(self) -> str:
        return f"{self.cause}: {self.fix}"


PAGE_FILE = StartFailure(
    "Windows' page file is too small for the GPU libraries",
    "let Windows manage the page file size (Settings > System > About > Advanced system "
    "settings > Performance > Settings > Advanced > Virtual memory), keep a few GiB free "
    "on drive C:, then restart vramgate",
    "let Windows manage the page file",
)
VC_RUNTIME = StartFailure(
    "a system library failed to start",
    "install the latest Microsoft Visual C++ Redistributable for Visual Studio 2015-2022 "
    "(x64), then restart vramgate",
    "install the Visual C++ Redistributable",
)
OLD_DRIVER = StartFailure(
    "the NVIDIA driver is too old for vramgate's CUDA libraries",
    "update the NVIDIA driver (NVIDIA App, or nvidia.com/drivers), then restart vramgate",
    "update the NVIDIA driver",
)
MISSING_DLL = StartFailure(
    "a library vramgate needs could not be loaded",
    "reinstall vramgate (an antivirus may have removed or blocked one of its files), and "
    "install the latest Microsoft Visual C++ Redistributable (x64)",
    "reinstall vramgate",
)

KNOWN: tuple[tuple[re.Pattern[str], StartFailure], ...] = (
    # ERROR_COMMITMENT_LIMIT, 1455 (Windows' System Error Codes): "The paging file is too
    # small for this operation to complete.", as torch/__init__.py raises it loading
    # torch/lib's DLLs: OSError: [WinError 1455] ... Error loading "...dll" or one of
    # its dependencies.
    (re.compile(r"WinError 1455\]|paging file is too small"), PAGE_FILE),
    # ERROR_DLL_INIT_FAILED, 1114: "A dynamic link library (DLL) initialization routine
    # failed." (c10.dll without the Visual C++ runtime it was built with)
    (re.compile(r"WinError 1114\]|DLL\) initialization routine failed"), VC_RUNTIME),
    # torch, c10/cuda/CUDAFunctions.cpp: "The NVIDIA driver on your system is too old
    # (found version 12040)"; the CUDA runtime's cudaGetErrorString for
    # cudaErrorInsufficientDriver (35), which ggml_cuda_init prints too: "CUDA driver
    # version is insufficient for CUDA runtime version"
    (
        re.compile(r"NVIDIA driver on your system is too old|driver version is insufficient"),
        OLD_DRIVER,
    ),
    # CPython, Python/dynload_win.c: "DLL load failed while importing %U: %U"; and
    # ERROR_MOD_NOT_FOUND, 126: "The specified module could not be found." (torch's
    # loader: OSError: [WinError 126] ... Error loading "...\c10.dll" or one of its
    # dependencies.)
    (re.compile(r"DLL load failed while importing|WinError 126\]"), MISSING_DLL),
)


def diagnose(lines: Iterable[str]) -> StartFailure | None:
    """The known cause among a server's last output lines, if any."""
    kept = list(lines)
    for pattern, failure in KNOWN:
        if any(pattern.search(line) for line in kept):
            return failure
    return None
