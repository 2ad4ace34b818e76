"""Moving model folders in and out of the models folder so that, whichever step fails,
the config names a model exactly when its folder is in place.

Windows refuses to move or delete a file that any handle holds open or mapped (a GGUF
reader's memmap, an open safetensors file), where Linux allows both. So every change is
a rename first (refused whole, or done whole), then the config, then the deletion of
what was set aside, whose failure is said and never undoes the rest: a folder left in a
`pull-` scratch folder is garbage, not a model (`vramgate list` skips those).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from app.config.settings import ModelSpec
from app.store.config_file import remove_from_config
from app.store.sources import PullError

SCRATCH_PREFIX = "pull-"


def scratch_folder(models_dir: Path) -> Path:
    """A new scratch folder beside the models: renames into and out of it stay on one
    disk, and so are atomic."""
    return Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=models_dir))


@contextlib.contextmanager
def moved_in(staging: Path, target: Path, aside: Path) -> Iterator[None]:
    """`staging` becomes `target`; a folder already at `target` is moved to `aside` first.
    When the body raises (the config entry could not be written), both moves are undone
    before the error goes on."""
    old = None
    if target.exists():
        try:
            os.replace(target, aside)
        except OSError as exc:
            raise PullError(f"could not move {target} out of the way: {exc}") from exc
        old = aside
    try:
        os.replace(staging, target)
    except OSError as exc:
        if old is not None:
            os.replace(old, target)
        raise PullError(f"could not move the model into {target}: {exc}") from exc
    try:
        yield
    except BaseException:
        os.replace(target, staging)
        if old is not None:
            os.replace(old, target)
        raise


def set_aside(folder: Path, models_dir: Path) -> Path:
    """`folder` moved whole into a new scratch folder (its deletion comes later, and
    may fail without harm); refused, with nothing changed, when a file in it is held."""
    scratch = scratch_folder(models_dir)
    try:
        os.replace(folder, scratch / folder.name)
    except OSError as exc:
        scratch.rmdir()
        raise PullError(
            f"could not remove {folder}: {exc}. A program (a server with the model loaded, "
            "an editor) holds a file in it; close it and try again. Nothing was changed"
        ) from exc
    return scratch


def remove_tree(folder: Path) -> list[str]:
    """Deletes `folder`, as far as it can: the paths it could not delete (held open on
    Windows), for the person to hear about."""
    left: list[str] = []
    shutil.rmtree(folder, onerror=lambda _f, path, _e: left.append(str(path)))
    return left


def left_behind(folder: Path, left: list[str]) -> str:
    return (
        f"could not delete {folder} ({len(left)} files in use, e.g. {left[0]}); it holds "
        "nothing vramgate uses: delete it once the program holding them has closed"
    )


def remove_model(
    config_file: Path,
    name: str,
    models_dir: Path,
    current: tuple[ModelSpec, ...],
    folder: Path | None,
) -> str | None:
    """The model out of the config and its folder (if given) deleted, in the order that
    keeps them consistent: the folder is set aside first (refused whole when a file in it
    is held), then the entry goes (the folder comes back if it cannot), then the set-aside
    copy is deleted. What could not be deleted is said, not ignored."""
    scratch = set_aside(folder, models_dir) if folder is not None else None
    try:
        remove_from_config(config_file, name, current)
    except BaseException:
        if scratch is not None and folder is not None:
            os.replace(scratch / folder.name, folder)
            scratch.rmdir()
        raise
    left = remove_tree(scratch) if scratch is not None else []
    return left_behind(scratch, left) if scratch is not None and left else None
