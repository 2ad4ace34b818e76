"""Which of llama.cpp's builds a runner imports: the one Python finds (the bundle's CUDA
build, or whatever xllamacpp is installed), then the builds a bundle carries beside it,
each a folder holding an `xllamacpp` package of its own (app.spec puts xllamacpp's CPU
build in `llama-cpu/`).

A build that cannot be imported here (the CUDA build without the NVIDIA driver:
"DLL load failed while importing xllamacpp", CPython's words) is left for the next, each
tried in a runner process of its own (app.engines.llama_cpp.process), so no half-loaded
library of one build is in the way of another. A runner started for a build in a folder
puts that folder first on its module path before anything imports xllamacpp
(`run_runner`), as the bundle's executable cannot be given a PYTHONPATH.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

ENGINE = "xllamacpp"
BUILD_FLAG = "--llama-build"  # the runner's argument: the build's folder
BUNDLED = (("cpu", "llama-cpu"),)  # (kind, folder under the bundle's _internal), in order
RUNNER_MODULE = "app.engines.llama_cpp.engine_builds"  # `python -m` this with BUILD_FLAG
# the file names that tell a build's kind, among its package's and its delvewheel
# (`xllamacpp.libs`) or auditwheel libraries: the first kind any name holds a word of
KIND_WORDS = (
    ("cuda", ("cublas", "cudart", "ggml-cuda")),
    ("rocm", ("rocblas", "hipblas", "amdhip", "ggml-hip")),
    ("vulkan", ("vulkan",)),
)


@dataclass(frozen=True)
class EngineBuild:
    """One build of xllamacpp: its kind (cpu, cuda, rocm, vulkan) and the folder it is
    imported from (None: where Python finds it)."""

    kind: str
    folder: Path | None = None

    def runner_argv(self, base: list[str], frozen: bool) -> list[str]:
        """How to start a runner on this build, given how the first is started (`base`:
        app.engines.llama_cpp.process.runner_argv's)."""
        if self.folder is None:
            return base
        flag = [BUILD_FLAG, str(self.folder)]
        return [*base, *flag] if frozen else [sys.executable, "-m", RUNNER_MODULE, *flag]


def build_kind(package: Path) -> str:
    """The kind of the xllamacpp build whose package folder is `package`, from the
    names of its libraries."""
    names = [p.name.lower() for folder in _library_folders(package) for p in folder.iterdir()]
    for kind, words in KIND_WORDS:
        if any(word in name for name in names for word in words):
            return kind
    return "cpu"


def _library_folders(package: Path) -> list[Path]:
    folders = [package, package.parent / f"{ENGINE}.libs", package.parent / f"{ENGINE}_libs"]
    return [folder for folder in folders if folder.is_dir()]


def installed_build() -> EngineBuild | None:
    """The build Python finds here (found, not imported: importing is the runner's)."""
    spec = importlib.util.find_spec(ENGINE)
    if spec is None:
        return None
    folders = list(spec.submodule_search_locations or [])
    return EngineBuild(build_kind(Path(folders[0])) if folders else "cpu")


def bundle_root() -> Path | None:
    """The bundle's `_internal` folder; None where vramgate runs from source."""
    meipass = getattr(sys, "_MEIPASS", None)
    return Path(meipass) if getattr(sys, "frozen", False) and meipass else None


def builds_here(root: Path | None = None) -> tuple[EngineBuild, ...]:
    """The builds to try, in order: the installed one, then the bundle's own."""
    root = root if root is not None else bundle_root()
    first = installed_build()
    builds = [first] if first is not None else []
    if root is not None:
        for kind, folder in BUNDLED:
            if (root / folder / ENGINE).is_dir():
                builds.append(EngineBuild(kind, root / folder))
    return tuple(builds)


def use_build(argv: list[str]) -> list[str]:
    """Puts the folder after BUILD_FLAG first on the module path; the rest of `argv`."""
    if BUILD_FLAG not in argv:
        return argv
    at = argv.index(BUILD_FLAG)
    sys.path.insert(0, argv[at + 1])
    return argv[:at] + argv[at + 2 :]


def run_runner(argv: list[str]) -> int:
    """A runner on the build `argv` names (app.engines.llama_cpp.runner_main)."""
    use_build(argv)
    from app.engines.llama_cpp import runner_main

    return runner_main.main()


if __name__ == "__main__":
    sys.exit(run_runner(sys.argv[1:]))
