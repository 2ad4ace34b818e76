"""Settings layering: defaults < TOML file < VRAMGATE_* env < CLI flags."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.config.settings import ModelSpec, load_settings


@pytest.fixture
def config(tmp_path, monkeypatch):
    for name in ("VRAMGATE_PORT", "VRAMGATE_DEVICE", "VRAMGATE_MODELS", "VRAMGATE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "config.toml"
    path.write_text(
        'port = 9001\ndevice = "simulated:4GiB"\nmax_queue = 7\n'
        '[[models]]\nname = "sim"\nkind = "simulated"\n'
    )
    return path


def test_defaults_are_local_and_safe(tmp_path, monkeypatch):
    monkeypatch.delenv("VRAMGATE_PORT", raising=False)
    settings = load_settings({}, tmp_path / "missing.toml")
    assert settings.host == "127.0.0.1"
    assert settings.models[0].name == "all-MiniLM-L6-v2" and settings.models[0].path is None


def test_file_then_env_then_cli(config, monkeypatch):
    from_file = load_settings({}, config)
    assert (from_file.port, from_file.max_queue, from_file.models[0].name) == (9001, 7, "sim")
    assert from_file.simulated_capacities() == (4 * 2**30,)
    monkeypatch.setenv("VRAMGATE_PORT", "9002")
    assert load_settings({}, config).port == 9002
    assert load_settings({"port": "9003"}, config).port == 9003
    assert load_settings({"port": "9003"}, config).max_queue == 7


def test_config_path_from_env(config, monkeypatch):
    monkeypatch.setenv("VRAMGATE_CONFIG", str(config))
    assert load_settings({}).port == 9001


def test_settings_are_frozen(config):
    settings = load_settings({}, config)
    with pytest.raises(ValidationError):
        settings.port = 1  # type: ignore[misc]


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "simulated:lots", "simulated:0GiB"])
def test_bad_device_is_refused(config, device):
    with pytest.raises(ValidationError):
        load_settings({"device": device}, config)


def test_sizes_take_units(config):
    settings = load_settings({"reserve": "256MiB", "max_body_bytes": "1MB"}, config)
    assert settings.reserve == 256 * 2**20 and settings.max_body_bytes == 1_000_000


def test_model_spec_from_the_command_line():
    spec = ModelSpec.parse_cli("bge=embedding:/models/bge")
    assert (spec.name, spec.kind, str(spec.path)) == ("bge", "embedding", "/models/bge")
    with pytest.raises(ValueError):
        ModelSpec.parse_cli("no-equals-sign")
    with pytest.raises(ValidationError):
        ModelSpec.parse_cli("../etc=embedding")


def test_duplicate_model_names_are_refused(config):
    with pytest.raises(ValidationError):
        load_settings({"models": (ModelSpec(name="a"), ModelSpec(name="a"))}, config)
