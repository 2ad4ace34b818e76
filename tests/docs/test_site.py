"""The site as CI builds and publishes it: `mkdocs build --strict` passes (a broken link,
anchor or include fails it; where the docs extra is not installed the test says so and
skips: .ci/run installs it and builds the site itself), every page is in the navigation,
and the docs workflow lints clean.

How it fails: a link to a page or heading that is gone (README.md's too), a page left
out of mkdocs.yml's nav, an included file (bench/README.md, SECURITY.md) moved, a
workflow actionlint refuses."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "docs.yml"


def nav_pages(nav: list) -> list[str]:
    found = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            found += nav_pages(value) if isinstance(value, list) else [value]
    return found


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(nav_pages(config["nav"])) == pages


def test_every_link_of_the_readme_reaches_a_file_and_heading():
    """README.md is no page of the site (GitHub shows it): its links are checked here."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if target.startswith(("http://", "https://", "#")):
            continue
        path, _, anchor = target.partition("#")
        page = ROOT / path
        heading = f"## {anchor.replace('-', ' ')}"
        if not page.exists() or (anchor and heading not in _headings(page)):
            broken.append(target)
    assert not broken, f"README.md links to what is not there: {broken}"


def _headings(page: Path) -> str:
    """The page's headings as their anchors read, lower case, punctuation dropped."""
    lines = page.read_text(encoding="utf-8").splitlines()
    heads = [
        re.sub(r"[^a-z0-9 ]", "", h.lstrip("#").strip().lower()) for h in lines if h.startswith("#")
    ]
    return "\n".join(f"## {h}" for h in heads)


def test_the_site_builds_strict(tmp_path: Path):
    mkdocs = shutil.which("mkdocs", path=os.path.dirname(sys.executable))
    if mkdocs is None:
        pytest.skip("the docs extra is not installed (pip install -e '.[docs]'); .ci/run builds it")
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "benchmarks" / "index.html").is_file()


def test_the_docs_workflow_lints_clean():
    actionlint = shutil.which("actionlint", path=os.path.dirname(sys.executable))
    if actionlint is None:
        pytest.skip("actionlint comes with the test extras on Linux x86-64 only")
    lint = subprocess.run([actionlint, str(WORKFLOW)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
