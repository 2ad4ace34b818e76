"""A model's entry: its draft model (`draft`), a served GGUF model's name or a .gguf file,
checked as the config is read (each refusal beside the entry that passes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.config.settings import load_settings


def config(tmp_path: Path, big: str, *others: str) -> Path:
    """A config file serving `big` (a GGUF's entry's extra lines) and the `others`."""
    path = tmp_path / "config.toml"
    entries = [f'[[models]]\nname = "big"\nkind = "generation"\npath = "/m/big.gguf"\n{big}']
    path.write_text("\n".join([*entries, *others]))
    return path


SMALL = '[[models]]\nname = "small"\nkind = "generation"\npath = "/m/small.gguf"\n'


def read(path: Path):
    return load_settings({}, path)


def test_a_draft_named_by_a_served_gguf_models_name_is_its_file(tmp_path):
    settings = read(config(tmp_path, 'draft = "small"\n', SMALL))
    big = settings.models[0]
    assert big.draft == "small" and big.draft_file() == Path("/m/small.gguf")
    assert settings.models[1].draft_file() is None


def test_a_draft_that_names_no_served_model_is_a_config_error(tmp_path):
    with pytest.raises(ValidationError, match="'nope' is not a served model"):
        read(config(tmp_path, 'draft = "nope"\n', SMALL))


def test_a_draft_may_be_a_gguf_file(tmp_path):
    big = read(config(tmp_path, 'draft = "/d/tiny.gguf"\n')).models[0]
    assert big.draft_file() == Path("/d/tiny.gguf")


@pytest.mark.parametrize(
    ("big", "other", "error"),
    [
        ('draft = "big"\n', SMALL, "a model cannot be its own draft"),
        ('draft = "/d/tiny.bin"\n', SMALL, "neither a model's name nor a .gguf file"),
        (
            'draft = "bge"\n',
            '[[models]]\nname = "bge"\nkind = "embedding"\npath = "/m/bge.gguf"\n',
            "is not a GGUF generation model (embedding)",
        ),
        (
            'draft = "folder"\n',
            '[[models]]\nname = "folder"\nkind = "generation"\npath = "/m/folder"\n',
            "is not a GGUF generation model",
        ),
        ('draft = "small"\nspeculative = false\n', SMALL, "speculative = false"),
        ('draft = "small"\nengine = "torch"\n', SMALL, "for a GGUF generation model"),
    ],
)
def test_drafts_that_cannot_be_are_config_errors(tmp_path, big, other, error):
    """(The config whose draft names a served GGUF model is read: the first test.)"""
    with pytest.raises(ValidationError, match=re.escape(error)):
        read(config(tmp_path, big, other))
