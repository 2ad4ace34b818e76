"""Constraints pinning every direct dependency of pyproject.toml to its lower bound, so
that CI tests the oldest versions the project claims to work with:

    pip install -c <(python .ci/lowest.py) -e '.[test]'

torch is left out: its older CPU builds come from PyTorch's own index only, which CI
cannot reach (the registry's older torch wheels are CUDA builds of several GiB); CI
tests the torch it installs, and docs/install.md says which.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

UNTESTABLE = {"torch"}
LOWER = re.compile(r"^\s*([A-Za-z0-9._-]+)(\[[^\]]*\])?\s*>=\s*([0-9][^,;\s]*)")


def constraints(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    lines = []
    for requirement in project["dependencies"]:
        found = LOWER.match(requirement)
        if found is None:
            raise SystemExit(f"no lower bound in {requirement!r}: give every dependency one")
        name, _, version = found.groups()
        if name.lower() in UNTESTABLE:
            continue
        marker = requirement.split(";", 1)[1].strip() if ";" in requirement else ""
        lines.append(f"{name}=={version}" + (f"; {marker}" if marker else ""))
    return lines


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    print("\n".join(constraints(root / "pyproject.toml")))
