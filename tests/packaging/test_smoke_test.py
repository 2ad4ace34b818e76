"""packaging/smoke_test.py's requests, against the server from source (the bundle's own
run is tests/packaging/test_bundle_build.py, minutes long): what it asks of a pulled VITS
or SpeechT5 is a sentence of speech."""

from __future__ import annotations

import pytest
from smoke_test import spoken_seconds

from app.config.settings import ModelSpec
from tests.support.live import live_server, make_settings
from tests.support.random_speecht5 import save_random_speecht5
from tests.support.random_vits import save_random_vits


@pytest.mark.parametrize("save", [save_random_vits, save_random_speecht5])
def test_the_smoke_tests_sentence_is_spoken(tmp_path, save):
    folder = save(tmp_path / "tiny-tts")
    spec = ModelSpec(name="tiny-tts", kind="speech_synthesis", path=folder)
    settings = make_settings(tmp_path, device="cpu", models=(spec,), cpu_threads=1)
    with live_server(settings) as live:
        seconds = spoken_seconds(live.url, "tiny-tts")
    assert 0.2 < seconds < 30
