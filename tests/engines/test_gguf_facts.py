"""Which layers of a GGUF attend to a sliding window, read from its header as llama.cpp
derives them (app.engines.gguf_facts), and the KV bytes they hold."""

from __future__ import annotations

from typing import Any

from app.engines.gguf_facts import facts_of, header_facts, read_gguf_facts
from app.engines.gguf_header import read_header
from tests.support.random_models import save_random_gemma3_gguf

MiB = 2**20


def facts(metadata: dict[str, Any], layers: int = 12) -> Any:
    blocks = [(f"blk.{i}.attn_q.weight", 1000) for i in range(layers)]
    return facts_of(metadata.get, blocks, 12_000, "model.gguf")


def test_gemma3s_layers_slide_but_each_sixth_from_its_header_and_from_the_file(tmp_path):
    path = save_random_gemma3_gguf(tmp_path / "g.gguf", layers=12, window=128)
    read = read_gguf_facts(path)
    assert read.sliding_window == 128
    assert read.sliding == (True,) * 5 + (False,) + (True,) * 5 + (False,)
    data = path.read_bytes()
    header = read_header(data[: 2 * MiB])
    assert header_facts(header, header.tensors, len(data), path.name) == read


def test_gemma2_alternates_with_its_default_window_and_a_llama_has_none():
    gemma2 = facts({"general.architecture": "gemma2", "gemma2.block_count": 4})
    assert gemma2.sliding_window == 4096  # llama.cpp's default where the key is absent
    assert gemma2.sliding == (True, False, True, False)
    said = {"general.architecture": "gemma2", "gemma2.block_count": 4}
    assert facts(said | {"gemma2.attention.sliding_window": 512}).sliding_window == 512
    llama = facts({"general.architecture": "llama", "llama.block_count": 12})
    assert (llama.sliding_window, llama.sliding) == (0, ())
    no_window = facts({"general.architecture": "gemma3", "gemma3.block_count": 12})
    assert (no_window.sliding_window, no_window.sliding) == (0, ())


def test_a_sliding_layer_holds_its_windows_cells_and_the_others_the_pools(tmp_path):
    """What llama.cpp logged loading this model at 32,768 cells and 32 slots: "32768
    cells, 1 layers" 32.00 MiB and "2560 cells, 5 layers" 12.50 MiB (f16)."""
    gemma = read_gguf_facts(
        save_random_gemma3_gguf(tmp_path / "g.gguf", layers=6, kv_heads=1, window=64)
    )
    assert gemma.kv_bytes("f16", 32768, 2560) == 32 * MiB + int(12.5 * MiB)
    assert gemma.kv_bytes("f16", 32768, 2560, range(5, 6)) == 32 * MiB  # the global one
    assert gemma.kv_bytes("f16", 32768, 2560, range(0, 2)) == 5 * MiB
    assert gemma.kv_bytes("f16", 4096, 4096) == gemma.kv_bytes_per_token("f16") * 4096


def test_a_local_files_facts_from_its_header_are_what_ggufs_own_reader_reads(tmp_path):
    """The header's bytes alone (read_gguf_facts) against gguf's reader of the whole file:
    the same tensors' bytes, architecture, layers and vocabulary."""
    import gguf

    path = save_random_gemma3_gguf(tmp_path / "g.gguf", layers=6, window=64)
    facts = read_gguf_facts(path)
    reader = gguf.GGUFReader(str(path))
    whole = sum(int(t.n_bytes) for t in reader.tensors)
    assert sum(facts.layer_bytes) + facts.other_bytes == whole > 0
    arch = reader.fields["general.architecture"]
    assert facts.architecture == bytes(arch.parts[arch.data[0]]).decode() == "gemma3"
    blocks = reader.fields["gemma3.block_count"]
    assert facts.layers == int(blocks.parts[blocks.data[0]][0]) == 6
    assert facts.vocab == len(reader.fields["tokenizer.ggml.tokens"].data)
    assert facts.file_bytes == path.stat().st_size
