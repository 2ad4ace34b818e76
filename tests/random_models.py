"""Small randomly initialised models, made on the spot and saved with the real save code,
for tests and for bench/gpu_check.py (model weights cannot be fetched from a hub here)."""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz"]


def save_random_bert(
    folder: Path,
    *,
    hidden: int,
    layers: int,
    heads: int,
    max_seq: int,
    pooling: str = "mean",
) -> Path:
    """A BERT with a letters-only vocabulary, saved as a sentence-transformers folder with
    `pooling` ("mean" or "cls") and no Normalize module."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=max_seq,
    )
    BertModel(config).save_pretrained(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": hidden,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
            }
        )
    )
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq}))
    return folder
