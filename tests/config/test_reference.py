"""The settings reference page against the classes it is written from: the page in
docs/ is what app.config.reference writes now, and every setting and every field of a
model's entry has a description (its `--help` line and its row on the page).

How it fails: a setting added, renamed or given another default without the page
written again (`python -m app.config.reference > docs/settings-reference.md`); a field
added with no description."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from app.config import reference
from app.config.model_spec import ModelSpec
from app.config.reference import settings_reference, undescribed
from app.config.settings import Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "settings-reference.md"


def test_the_page_is_what_the_settings_classes_write():
    assert PAGE.read_text(encoding="utf-8") == settings_reference(), (
        "docs/settings-reference.md is stale: python -m app.config.reference > "
        "docs/settings-reference.md"
    )


def test_every_setting_and_model_field_has_a_description():
    assert not undescribed(), f"give these a description=...: {undescribed()}"


def test_the_page_names_every_setting_its_variable_and_every_model_field():
    page = settings_reference()
    for name in Settings.model_fields:
        assert f"| `{name}` | `VRAMGATE_{name.upper()}` |" in page, name
    for name, field in ModelSpec.model_fields.items():
        assert f"| `{name}` |" in page and (field.description or "") in page, name


def test_a_field_without_a_description_is_named(monkeypatch):
    class Bare(Settings):
        undocumented_knob: int = Field(0)

    monkeypatch.setattr(reference, "Settings", Bare)
    assert undescribed() == ["Bare.undocumented_knob"]
