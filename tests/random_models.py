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


CORPUS = [
    "The capital of France is Paris.",
    "What is the capital of France?",
    "Hello! How are you today? I am fine, thank you.",
    "vramgate admits work by measured memory bytes.",
    "0123456789 +-*/=()[]{}<>,.;:!?'\"",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def save_random_llama(
    folder: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    context: int = 1024,
) -> Path:
    """A Llama-style causal LM with a byte-level BPE tokenizer trained here on a few lines
    (real tokenizer files, any text encodes) and a chat template, saved with
    `save_pretrained`. The end-of-text row of the output layer is zeroed so that greedy
    decoding never ends early: tests decide how long a generation runs."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=context,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id].zero_()
    model.save_pretrained(folder)
    return folder


def save_model_wheel(model: Path, wheel: Path) -> Path:
    """A wheel holding the model folder as package data (a known convention, e.g.
    spaCy's): `PACKAGE/MODEL_NAME/...`, so that `pull` names the model after its folder."""
    import zipfile

    package = wheel.name.split("-")[0]
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{package}/__init__.py", b"")
        archive.writestr(f"{package}-1.0.dist-info/WHEEL", b"Wheel-Version: 1.0\n")
        for path in sorted(model.rglob("*")):
            if path.is_file():
                archive.write(path, f"{package}/{model.name}/{path.relative_to(model)}")
    return wheel
