"""Live servers that several API test modules talk to through the official client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from app.config.settings import ModelSpec
from tests.support.random_models import save_random_llama


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random SD 1.5- and SDXL-shaped diffusers folders, "sd15" and "sdxl"."""
    from tests.support.random_models import save_random_sd15, save_random_sdxl

    root = tmp_path_factory.mktemp("diffusion")
    return {"sd15": save_random_sd15(root / "sd15"), "sdxl": save_random_sdxl(root / "sdxl")}


def serve(tmp_path_factory: pytest.TempPathFactory, *models: ModelSpec) -> Iterator[OpenAI]:
    """`models` on the CPU behind a live server; an `openai` client pointed at it."""
    from tests.support.live import live_server, make_settings

    settings = make_settings(tmp_path_factory.mktemp("server"), device="cpu", models=models)
    with live_server(settings) as live:
        yield OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAI]:
    """A small random Llama named "tiny" (its free text is noise)."""
    folder = save_random_llama(tmp_path_factory.mktemp("tiny-llama"), context=1024)
    yield from serve(tmp_path_factory, ModelSpec(name="tiny", kind="generation", path=folder))


@pytest.fixture(scope="module")
def small_llm(smollm2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAI]:
    """SmolLM2-135M-Instruct, named "smollm2"."""
    yield from serve(tmp_path_factory, ModelSpec(name="smollm2", kind="generation", path=smollm2))
