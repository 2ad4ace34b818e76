"""The Layout section of docs/layout.md ("Developing vramgate"), the newcomer's map,
against the tree: every package of app/ is named in it, and every path and module it
names exists. And the size rule that replaced a line count: a module over 600 lines or a
function over 80 says why in its docstring ("Long because ...").

How it fails: a package added (or moved) without its line in the map, a module renamed
while the map still names the old one, a 700-line module that does not say why."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONG_MODULE, LONG_FUNCTION = 600, 80
WHY = "Long because"


def layout_section() -> str:
    readme = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    start = readme.index("\n## Layout\n")
    end = readme.find("\n## ", start + 1)
    return readme[start : end if end != -1 else len(readme)]


def packages() -> list[str]:
    return sorted(
        f"{p.parent.relative_to(ROOT).as_posix()}/" for p in (ROOT / "app").rglob("__init__.py")
    )


def test_every_package_of_app_is_named_in_the_layout():
    section = layout_section()
    missing = [package for package in packages() if f"`{package}`" not in section]
    assert not missing, f"docs/layout.md's Layout does not name: {missing}"


def test_every_path_and_module_the_layout_names_exists():
    section = layout_section()
    named = re.findall(r"`([A-Za-z0-9_./]+)`", section)
    paths = [n for n in named if "/" in n and not n.startswith("/")]
    assert "app/engines/llama_cpp/" in paths  # the scan reads the section
    stale = [p for p in paths if not (ROOT / p).exists()]
    files = {p.name for p in ROOT.glob("**/*.py") if ".venv" not in p.parts}
    modules = [n for n in named if "/" not in n and n.endswith(".py")]
    stale += [m for m in modules if m not in files]
    assert not stale, f"docs/layout.md's Layout names what is not in the tree: {stale}"


def test_a_long_module_or_function_says_why():
    unexplained = []
    for path in [*(ROOT / "app").rglob("*.py"), *(ROOT / "tray").rglob("*.py")]:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        where = path.relative_to(ROOT).as_posix()
        if source.count("\n") > LONG_MODULE and WHY not in (ast.get_docstring(tree) or ""):
            unexplained.append(where)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > LONG_FUNCTION and WHY not in (ast.get_docstring(node) or ""):
                unexplained.append(f"{where}:{node.name} ({lines} lines)")
    assert not unexplained, f"long, and not saying why ({WHY} ...): {unexplained}"
