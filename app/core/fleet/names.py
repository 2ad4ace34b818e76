"""The names apps send that no served model has, and the model each reaches: first the
`model_aliases` setting's patterns (first match wins: a person's own choice), then the
standard names below, what apps send when their model field is left empty, then the Hub
source a model was pulled from. Open WebUI's OpenAI image engine sends `dall-e-2`, its
speech to text an empty `model`, its text to speech `tts-1`: each reaches the served
model of its kind. After `ollama pull hf.co/ORG/NAME:QUANT` Ollama's clients chat with
that name (`ollama run` does both): it reaches the model pulled from there; after
`ollama pull llama3.2` (one of Ollama's library names), `llama3.2` does.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from app.config.hub_names import hub_reference
from app.config.ollama_names import library
from app.errors import InvalidRequest


@dataclass(frozen=True)
class StandardName:
    pattern: str  # a glob, as `model_aliases`' ("" matches the empty name only)
    capability: str  # what the model it reaches does (a card's capability)
    # with several such models: the first configured (the default one), or a 400 that
    # lists them (a name that cannot choose between them)
    several: Literal["first", "refuse"]
    what: str  # the kind, for people


STANDARD_NAMES = (
    StandardName("dall-e-*", "image_generation", "first", "image"),  # OpenAI's image models
    StandardName("gpt-image-*", "image_generation", "first", "image"),
    StandardName("", "transcription", "refuse", "speech to text"),  # an empty `model`
    StandardName("tts-*", "speech", "first", "text to speech"),  # OpenAI's speech models
    StandardName("gpt-4o-mini-tts*", "speech", "first", "text to speech"),
)


def aliased(name: str, aliases: Mapping[str, str]) -> str | None:
    """The served model the first `model_aliases` pattern matching `name` names."""
    for pattern, served in aliases.items():
        if fnmatch.fnmatchcase(name, pattern):
            return served
    return None


def standard_target(name: str, models: Sequence[tuple[str, tuple[str, ...]]]) -> str | None:
    """The served model a standard name reaches, of `models` (name and capabilities, in
    config order): None when `name` is no standard name or no model of its kind is
    served; a 400 listing them when several are and the name cannot choose."""
    for standard in STANDARD_NAMES:
        if not fnmatch.fnmatchcase(name, standard.pattern):
            continue
        found = [model for model, capabilities in models if standard.capability in capabilities]
        if len(found) > 1 and standard.several == "refuse":
            asked = f"model {name!r}" if name else "an empty `model`"
            raise InvalidRequest(
                f"{asked} names no {standard.what} model of the {len(found)} served: name one "
                f"of {', '.join(found)} (or map it to one in model_aliases)",
                param="model",
                details={"models": found},
            )
        return found[0] if found else None
    return None


def standard_names_of(
    model: str, models: Sequence[tuple[str, tuple[str, ...]]], aliases: Mapping[str, str]
) -> list[str]:
    """The standard names that reach `model` (those `model_aliases` does not take)."""
    names = []
    for standard in STANDARD_NAMES:
        if standard.pattern in aliases:
            continue
        found = [name for name, capabilities in models if standard.capability in capabilities]
        one = len(found) == 1 or (found and standard.several == "first")
        if one and found[0] == model:
            names.append(standard.pattern)
    return names


def hub_target(name: str, pulled: Sequence[tuple[str, str | None]]) -> str | None:
    """The served model pulled from the Hub source `name` spells (`hf.co/ORG/NAME:QUANT`,
    any case; without a quantisation, the first pulled from that repo) or one of Ollama's
    library names means (`llama3.2`: app.config.ollama_names), of `pulled` (each model's
    name and `pulled_from`, in config order), or None."""
    asked = hub_reference(name)
    if asked is None and (known := library().find(name)) is not None:
        asked = known.repo, known.quant if known.named else None
    if asked is None:
        return None
    repo, quant = asked
    for model, source in pulled:
        found = hub_reference(source) if source else None
        if found is None or found[0].lower() != repo.lower():
            continue
        if quant is None or (found[1] or "").upper() == quant.upper():
            return model
    return None


def ollama_spelling(pulled_from: str) -> str | None:
    """How Ollama's clients name a model pulled from `pulled_from` (`hf.co/ORG/NAME:Q`)."""
    found = hub_reference(pulled_from)
    if found is None:
        return None
    repo, quant = found
    return f"hf.co/{repo}" + (f":{quant}" if quant else "")
