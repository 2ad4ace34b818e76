"""A config's own table of Ollama names (`ollama_names = PATH`, app.config.ollama_names
`use`): its names are added to the shipped ones and replace those of the same name; a
broken one is refused naming what is wrong; without it the shipped table is back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config import ollama_names
from app.config.ollama_names import library

OWN = """
[[names]]
name = "mymodel"
default = "1b"
quant = "Q8_0"
tags = { "1b" = "Me/My-1B-GGUF", "7b" = "Me/My-7B-GGUF" }

[[names]]
name = "llama3.2"
default = "3b"
quant = "Q5_K_M"
tags = { "3b" = "Me/Llama-3.2-3B-Mine-GGUF" }
"""


@pytest.fixture
def own(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "names.toml"
    path.write_text(OWN)
    yield path
    ollama_names.use(None)


def test_a_configs_own_names_are_added_and_replace_the_shipped_ones(own):
    shipped = library()
    assert shipped.find("mymodel") is None
    ollama_names.use(own)
    mine = library().find("mymodel:7b")
    assert mine is not None and (mine.repo, mine.quant) == ("Me/My-7B-GGUF", "Q8_0")
    llama = library().find("llama3.2")
    assert llama is not None and (llama.repo, llama.quant) == (
        "Me/Llama-3.2-3B-Mine-GGUF",
        "Q5_K_M",
    )
    assert library().find("qwen3:4b") == shipped.find("qwen3:4b")  # the others kept
    assert "mymodel" in library().close_to("mymodle")
    ollama_names.use(None)
    assert library().find("mymodel") is None and library().find("llama3.2") == shipped.find(
        "llama3.2"
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[[names]]\nname = "x"\ntags = { "1b" = "A/B" }\n', "lacks default, quant"),
        ('[[names]]\nname = "x"\ndefault = "2b"\nquant = "Q4_0"\ntags = { "1b" = "A/B" }\n',
         "default tag '2b' is none of its tags"),
        ("[[names]\n", "names.toml"),  # not TOML
    ],
)  # fmt: skip
def test_a_broken_table_is_refused_naming_what_is_wrong(tmp_path, text, said):
    path = tmp_path / "names.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=said):
        ollama_names.use(path)
    assert library().find("x") is None  # the shipped table stays in use
