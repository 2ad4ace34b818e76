"""The table of Ollama's library names: each spelling Ollama's users type reaches a repo
and a quantisation, an unknown one finds what to type instead, and every entry of the
shipped table has the shape a pull needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config.hub_names import HUB_ID
from app.config.ollama_names import LibraryName, library, read_library, shaped_like_a_name
from app.store.hub import BITS

LLAMA_3B = "bartowski/Llama-3.2-3B-Instruct-GGUF"


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("llama3.2", LibraryName("llama3.2", "3b", LLAMA_3B, "Q4_K_M", False)),
        ("llama3.2:latest", LibraryName("llama3.2", "3b", LLAMA_3B, "Q4_K_M", False)),
        ("Llama3.2:3B", LibraryName("llama3.2", "3b", LLAMA_3B, "Q4_K_M", False)),
        (
            "llama3.2:1b",
            LibraryName("llama3.2", "1b", "bartowski/Llama-3.2-1B-Instruct-GGUF", "Q4_K_M", False),
        ),
        ("llama3.2:3b-instruct-q8_0", LibraryName("llama3.2", "3b", LLAMA_3B, "Q8_0", True)),
        ("llama3.2:3b-instruct-fp16", LibraryName("llama3.2", "3b", LLAMA_3B, "F16", True)),
        ("qwen3:4b", LibraryName("qwen3", "4b", "unsloth/Qwen3-4B-GGUF", "Q4_K_M", False)),
        ("gemma3:1b", LibraryName("gemma3", "1b", "unsloth/gemma-3-1b-it-GGUF", "Q4_K_M", False)),
        (
            "qwen2.5-coder:7b",
            LibraryName(
                "qwen2.5-coder", "7b", "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF", "Q4_K_M", False
            ),
        ),
        ("gpt-oss", LibraryName("gpt-oss", "20b", "ggml-org/gpt-oss-20b-GGUF", "MXFP4", False)),
        ("qwen3:5b", None),  # a size the name lacks
        ("llama9", None),
        ("bartowski/Llama-3.2-3B-Instruct-GGUF", None),  # a repo: the Hub's spellings
        ("no such thing", None),
    ],
)
def test_each_spelling_reaches_its_repo_and_quantisation(text, found):
    assert library().find(text) == found


def test_an_unknown_name_finds_the_nearest_names_and_a_missing_size_the_names_sizes():
    assert set(library().close_to("llama3.9")[:3]) == {"llama3.2", "llama3.1", "llama3.3"}
    assert library().close_to("qwen3:5b") == [
        "qwen3:0.6b", "qwen3:1.7b", "qwen3:4b", "qwen3:8b", "qwen3:14b",
    ]  # fmt: skip
    assert library().close_to("zzzzzz") == []


def test_names_are_told_from_paths_and_repos():
    assert shaped_like_a_name("llama3.2") and shaped_like_a_name("qwen3:4b")
    for text in ("org/repo", "./model", "C:\\models\\x", "no such thing", "a:b:c"):
        assert not shaped_like_a_name(text)


def test_the_shipped_table_says_where_it_comes_from_and_each_entry_can_be_pulled():
    table = library()
    assert table.source and table.date
    assert len(table.families) >= 15
    for family in table.families.values():
        assert family.default in family.tags, family.name
        assert family.quant in BITS, family.name
        for tag, repo in family.tags.items():
            assert HUB_ID.match(repo), (family.name, tag, repo)
            assert repo.lower().endswith("-gguf"), (family.name, tag, repo)
            assert shaped_like_a_name(f"{family.name}:{tag}")
            assert library().find(f"{family.name}:{tag}") is not None


def test_a_table_whose_default_is_none_of_its_tags_is_refused(tmp_path: Path):
    table = tmp_path / "names.toml"
    table.write_text(
        'source = "s"\ndate = "d"\n[[names]]\nname = "x"\ndefault = "2b"\nquant = "Q4_K_M"\n'
        'tags = { "1b" = "o/x-GGUF" }\n'
    )
    with pytest.raises(ValueError, match="x's default tag '2b' is none of its tags"):
        read_library(table)
