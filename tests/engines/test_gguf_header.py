"""A GGUF's header read from its first bytes alone (app.engines.gguf_header) gives the
facts gguf's reader gives of the whole file, and says how far short bytes fall."""

from __future__ import annotations

import pytest

from app.engines.gguf_facts import header_facts, read_gguf_facts
from app.engines.gguf_header import HeaderIncomplete, read_header


def test_the_header_alone_gives_the_facts_of_the_whole_file(smollm2_gguf):
    data = smollm2_gguf.read_bytes()
    header = read_header(data[: 2 * 2**20])  # 2 MiB of 98 MB
    assert header.end <= 2 * 2**20 and len(header.tensors) == 272
    facts = header_facts(header, header.tensors, len(data), smollm2_gguf.name)
    assert facts == read_gguf_facts(smollm2_gguf)
    assert header.metadata["general.architecture"] == "llama"
    assert header.metadata["tokenizer.ggml.tokens"] is None  # 49,152 strings: stepped over
    assert header.lengths["tokenizer.ggml.tokens"] == 49152  # but counted
    assert facts.vocab == 49152  # a row of logits: what a speculating runner's drafts cost


def test_a_header_without_the_vocab_size_key_counts_the_tokenizers_tokens(smollm2_gguf):
    data = smollm2_gguf.read_bytes()
    header = read_header(data[: 2 * 2**20])
    del header.metadata["llama.vocab_size"]
    assert header_facts(header, header.tensors, len(data), smollm2_gguf.name).vocab == 49152


def test_bytes_that_end_inside_the_header_say_how_many_more_are_needed(smollm2_gguf):
    data = smollm2_gguf.read_bytes()
    with pytest.raises(HeaderIncomplete) as short:
        read_header(data[:100_000])
    assert short.value.needed > 100_000
    with pytest.raises(ValueError, match="not a GGUF"):
        read_header(b"PK\x03\x04" + data[4:100])
