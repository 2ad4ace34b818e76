"""The fenced blocks of the documentation (README.md and docs/*.md), each with the line
that says what the tests do with it.

A block runs by default: a shell block in bash, a Python block in Python, against the
live server of tests/docs/test_examples.py (the address `127.0.0.1:8450` or
`localhost:8450` becomes that server's); a TOML block is loaded as a config file, a YAML
or JSON block parsed. The line just above a block may say otherwise:

- `<!-- docs: not run, WHY -->`: a block that cannot run here (a GPU, Windows, another
  program, a placeholder) is checked for syntax only, and says why;
- `<!-- docs: output -->`: what the runnable block before it prints or answers; the test
  compares them.

Files the pages include as they are (bench/README.md, SECURITY.md) are checked for
syntax only: their commands are the benchmarks' own, minutes long."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
INCLUDED = [ROOT / "bench" / "README.md", ROOT / "SECURITY.md"]
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")
MARKER = re.compile(r"^<!-- docs: (.*?) -->$")
LANGS = {"sh", "python", "toml", "yaml", "json", "powershell", ""}
# the address the pages use, and what it becomes
ADDRESS = re.compile(r"(?:http://)?(?:127\.0\.0\.1|localhost):8450")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None  # what the line above says, or None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"

    @property
    def is_output(self) -> bool:
        return self.marker == "output"

    @property
    def not_run(self) -> str | None:
        """Why it is not run, where its line says so."""
        if self.marker and self.marker.startswith("not run, "):
            return self.marker.removeprefix("not run, ")
        return None

    @property
    def runs(self) -> bool:
        return self.marker is None and self.lang in ("sh", "python")

    def pointed_at(self, url: str) -> str:
        """Its text, the documented address replaced by `url`'s."""
        host = url.removeprefix("http://")
        return ADDRESS.sub(
            lambda m: ("http://" if m.group(0).startswith("http") else "") + host, self.text
        )


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").split("\n")
    found, n = [], 0
    while n < len(lines):
        opened = FENCE.match(lines[n])
        if not opened:
            n += 1
            continue
        above = next((lines[k] for k in range(n - 1, -1, -1) if lines[k].strip()), "")
        marker = MARKER.match(above.strip())
        end = next(k for k in range(n + 1, len(lines)) if lines[k].startswith("```"))
        text = "\n".join(lines[n + 1 : end]) + "\n"
        found.append(Block(page, n + 1, opened.group(1), text, marker.group(1) if marker else None))
        n = end + 1
    return found


def every_block() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def included_blocks() -> list[Block]:
    return [block for page in INCLUDED for block in blocks(page)]


def with_outputs() -> list[tuple[Block, Block | None]]:
    """Each block that runs, with the output block that follows it on its page."""
    pairs = []
    for page in PAGES:
        found = blocks(page)
        for k, block in enumerate(found):
            if not block.runs:
                continue
            after = found[k + 1] if k + 1 < len(found) and found[k + 1].is_output else None
            pairs.append((block, after))
    return pairs
