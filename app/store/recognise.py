"""What a pull fetched, recognised: where the model is inside it, which kind it is, which
name it gets, and whether this installation can serve its family."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from app.config.settings import MODEL_NAME_PATTERN
from app.engines.torch.families import (
    EMBEDDING_FAMILIES,
    SPEECH_FAMILIES,
    SPEECH_SYNTHESIS_FAMILIES,
    sees_images,
)
from app.store.sources import PullError

Kind = Literal["embedding", "generation", "rerank", "diffusion", "speech", "speech_synthesis"]
KINDS: tuple[str, ...] = Kind.__args__  # type: ignore[attr-defined]


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


SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def shards_of(gguf: Path) -> list[Path]:
    """A split GGUF's files (`NAME-00001-of-00003.gguf`...), found beside its first one;
    llama.cpp loads them from there by these names. A whole file: itself."""
    match = SHARD.search(gguf.name)
    if match is None:
        return [gguf]
    count = int(match[2])
    prefix = gguf.name[: match.start()]
    shards = [gguf.with_name(f"{prefix}-{i:05d}-of-{match[2]}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in shards if not p.is_file()]
    if missing:
        raise PullError(f"{gguf.name} is one of {count} files; missing: {', '.join(missing)}")
    return shards


def detect_kind(model: Path) -> Kind:
    """The kind a model is, from its files; never a guess: a folder of a transformers
    architecture no kind serves is refused, naming it and the kinds there are."""
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
    model_type = config.get("model_type")
    if model_type in SPEECH_FAMILIES:
        return "speech"  # Whisper: speech to text (app.engines.torch.speech)
    if model_type in SPEECH_SYNTHESIS_FAMILIES and (
        model_type != "speecht5" or "SpeechT5ForTextToSpeech" in architectures
    ):  # VITS, MMS-TTS, SpeechT5's text to speech (app.engines.torch.speech_synthesis)
        return "speech_synthesis"
    if sees_images(model):
        return "generation"  # a vision-language model: chat with images
    if model_type in EMBEDDING_FAMILIES:
        return "embedding"  # an encoder without sentence-transformers' files: mean pooled
    architecture = ", ".join(architectures) or "none named"
    raise PullError(
        f"{model.name} is a {architecture} (model_type {model_type!r}), which no kind of "
        f"model vramgate serves: {', '.join(KINDS)}. Pass --kind where it is one of them"
    )


def check_servable(folder: Path) -> None:
    """Refuses a folder of a transformers family this installation cannot serve."""
    from app.engines.torch.families import refusal

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    why = refusal(config.get("model_type"))
    if why is not None:
        raise PullError(f"{folder.name} cannot be served: {why}")


def default_name(model: Path) -> str:
    stem = model.name.split(".")[0] if model.is_file() else model.name
    stem = SHARD.sub("", model.name) if SHARD.search(model.name) else stem
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:64] or "model"
    if not re.match(MODEL_NAME_PATTERN, name):
        raise PullError(f"cannot make a model name from {model.name!r}; pass --name")
    return name
