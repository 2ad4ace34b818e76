"""The config file's [[models]] tables, edited as text: a model added at the end, one
taken out with every other line (and comment) kept, the file read back after each change
and restored when it would not read as expected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.config.settings import ModelSpec, read_config_file, tomllib
from app.store.sources import PullError


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
    if spec.pulled_from is not None:
        lines.append(f"pulled_from = {json.dumps(spec.pulled_from)}")
    return "\n".join(lines)
