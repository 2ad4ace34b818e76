"""Ollama's library names (`llama3.2`, `qwen3:4b`, `gemma3:1b`), as `ollama pull` and
Open WebUI's pull box send them, and the Hub GGUF repo and quantisation each means here:
a fact table shipped with vramgate (ollama_names.toml, with its source and date).

`vramgate pull`, Ollama's `/api/pull` (app.store.sources) and the names a request may
use for a pulled model (app.core.fleet.names) read it: after `ollama pull llama3.2` the
client chats with `llama3.2`, which reaches the model pulled from that repo. Here, not in
app.store, because both the store and the core read it (as app.config.hub_names).

A config may add names, or change what one means, with a table of its own in the same
shape (`ollama_names = "PATH"`, read over the shipped one: `use`).

`NAME` and `NAME:latest` are the name's default tag; `NAME:SIZE` a size's repo, at the
table's quantisation (else, where the repo lacks it, the one nearest to it, as a pull of
the repo chooses); `NAME:SIZE-...-QUANT` (Ollama's `3b-instruct-q8_0`) that size's repo at
that quantisation.
"""

from __future__ import annotations

import difflib
import functools
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).with_name("ollama_names.toml")
# a library name as Ollama spells it (any case here): a word, an optional tag; no '/'
SPELLING = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9._-]{0,63})(?::(?P<tag>[a-z0-9._-]{1,64}))?$", re.IGNORECASE
)
# the quantisation a tag ends with: `-q4_K_M`, `-q8_0`, `-iq3_m`, `-fp16`
TAG_QUANT = re.compile(r"-((?:i?q[1-8](?:_[0-9a-z]+)*)|fp16|f16|bf16|mxfp4)$", re.IGNORECASE)


@dataclass(frozen=True)
class LibraryName:
    """One of Ollama's names as it resolved: the name and size tag, and what to pull."""

    name: str
    tag: str
    repo: str
    quant: str  # the tag's, else the table's default for the name
    named: bool  # whether the tag named it (else the repo's nearest does where it lacks it)

    @property
    def spelled(self) -> str:
        return f"{self.name}:{self.tag}"


@dataclass(frozen=True)
class Family:
    """A name's table: its size tags' repos, its default tag and quantisation."""

    name: str
    default: str
    quant: str
    tags: dict[str, str]


@dataclass(frozen=True)
class Library:
    source: str
    date: str
    families: dict[str, Family]

    def find(self, text: str) -> LibraryName | None:
        """What `text` names, or None where it is no name of the table (or no spelling
        of one)."""
        spelled = SPELLING.match(text.strip())
        if spelled is None:
            return None
        family = self.families.get(spelled["name"].lower())
        if family is None:
            return None
        tag = (spelled["tag"] or "latest").lower()
        if tag == "latest":
            tag = family.default
        quant, named = family.quant, False
        if tag not in family.tags and (found := TAG_QUANT.search(tag)) is not None:
            quant, named = _quant_label(found[1]), True
            tag = tag.split("-", 1)[0]
        repo = family.tags.get(tag)
        return LibraryName(family.name, tag, repo, quant, named) if repo is not None else None

    def spellings(self) -> list[str]:
        """Every name, and every name with each of its tags."""
        found = []
        for family in self.families.values():
            found += [family.name, *(f"{family.name}:{tag}" for tag in family.tags)]
        return found

    def close_to(self, text: str, count: int = 5) -> list[str]:
        """What to type instead of `text`: a name's own tags where it names a tag the
        name lacks (`qwen3:5b`), else the names nearest to its name (`llama3.9`: the
        llamas); at most `count`."""
        name, _, tag = text.strip().lower().partition(":")
        if tag and name in self.families:
            return [f"{name}:{known}" for known in self.families[name].tags][:count]
        return difflib.get_close_matches(name, list(self.families), count, cutoff=0.5)


def shaped_like_a_name(text: str) -> bool:
    """Whether `text` is spelled as one of Ollama's library names (a word with an
    optional tag, no '/'), whether or not the table has it."""
    return SPELLING.match(text.strip()) is not None


def _quant_label(text: str) -> str:
    label = text.upper()
    return "F16" if label == "FP16" else label


def read_library(path: Path = TABLE, shipped: bool = True) -> Library:
    """The table at `path`; ValueError naming what is wrong with it. A config's own table
    (`shipped` False) may leave out the source and date."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if not shipped:
        data = {"source": str(path), "date": "", **data}
    families: dict[str, Family] = {}
    for entry in data.get("names", []):
        missing = [key for key in ("name", "tags", "default", "quant") if key not in entry]
        if missing:
            raise ValueError(f"{path}: a [[names]] table lacks {', '.join(missing)}")
        name = str(entry["name"])
        tags = {str(tag).lower(): str(repo) for tag, repo in dict(entry["tags"]).items()}
        default = str(entry["default"]).lower()
        if default not in tags:
            raise ValueError(f"{path.name}: {name}'s default tag {default!r} is none of its tags")
        families[name.lower()] = Family(name, default, str(entry["quant"]).upper(), tags)
    return Library(str(data["source"]), str(data["date"]), families)


@functools.cache
def library() -> Library:
    """The table shipped with vramgate, with the config's own (`use`) over it; read once."""
    shipped = read_library()
    if _OWN is None:
        return shipped
    own = read_library(_OWN, shipped=False)
    return Library(shipped.source, shipped.date, shipped.families | own.families)


_OWN: Path | None = None  # the config's table (settings.ollama_names), set by `use`


def use(path: Path | None) -> None:
    """Read the config's table (`ollama_names`) over the shipped one from now on; a
    ValueError or OSError names what is wrong with it, read here at once."""
    global _OWN
    if path is not None:
        read_library(path, shipped=False)
    _OWN = path
    library.cache_clear()
