"""Small randomly initialised models, made on the spot and saved with the real save code,
for tests and for bench/gpu_check.py (model weights cannot be fetched from a hub here)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

LETTERS = "abcdefghijklmnopqrstuvwxyz"
# Letters, and letters inside a word: any lower-case word spells out (no [UNK] for words)
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *LETTERS, *(f"##{c}" for c in LETTERS)]


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
    # transformers 5 takes the vocabulary itself (a vocab_file alone leaves 5 tokens)
    tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(VOCAB)})
    tokenizer.save_pretrained(folder)
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
    sliding_window: int | None = None,
) -> Path:
    """A Llama-style causal LM with a byte-level BPE tokenizer trained here on a few lines
    (real tokenizer files, any text encodes) and a chat template, saved with
    `save_pretrained`. The end-of-text row of the output layer is zeroed so that greedy
    decoding never ends early: tests decide how long a generation runs. With a
    `sliding_window` it is a Mistral (v0.1's attention: its KV cache is a sliding
    window's, which rows cannot join)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_byte_level_bpe(), bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    family = {"config": LlamaConfig, "model": LlamaForCausalLM, "extra": {}}
    if sliding_window is not None:
        from transformers import MistralConfig, MistralForCausalLM

        extra = {"sliding_window": sliding_window}
        family = {"config": MistralConfig, "model": MistralForCausalLM, "extra": extra}
    config = family["config"](
        **family["extra"],
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
    model = family["model"](config)
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id].zero_()
    model.save_pretrained(folder)
    return folder


def _byte_level_bpe() -> Any:
    """A byte-level BPE tokenizer (tokenizers') trained here on CORPUS, with <s>, </s> and
    <pad> as its special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer)
    return bpe


def save_random_gemma3_gguf(
    gguf_file: Path,
    *,
    layers: int = 6,
    window: int = 64,
    context: int = 8192,
    width: int = 256,
    heads: int = 4,
    kv_heads: int = 4,
    head_dim: int = 256,
) -> Path:
    """A random Gemma 3 written straight as a GGUF with gguf's writer, as llama.cpp's
    converter lays one out (its `gemma3` tensors and keys, float16 weights, no output
    head: the embeddings are tied), with sliding-window metadata: every layer but each
    sixth attends to the last `window` tokens (`gemma3.attention.sliding_window`), as
    Gemma 3's do; the tokenizer is `_byte_level_bpe`'s, as a "gpt2" token list. Its
    weights are noise: it loads (llama.cpp sizes its KV caches from the header) and
    generates nonsense."""
    import gguf
    import numpy as np

    doc = json.loads(_byte_level_bpe().to_str())
    vocab = doc["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    writer = gguf.GGUFWriter(str(gguf_file), "gemma3")
    writer.add_name("random-gemma3")
    writer.add_context_length(context)
    writer.add_embedding_length(width)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(2 * width)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1e6)
    writer.add_sliding_window(window)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in ("<s>", "</s>", "<pad>") else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab["<s>"])
    writer.add_eos_token_id(vocab["</s>"])
    writer.add_pad_token_id(vocab["<pad>"])
    writer.add_chat_template(CHAT_TEMPLATE)
    random = np.random.default_rng(0)
    names, kinds = gguf.TENSOR_NAMES, gguf.MODEL_TENSOR

    def add(kind: Any, shape: tuple[int, ...], block: int = 0) -> None:
        name = names[kind].format(bid=block) + ".weight"
        if len(shape) == 1:  # a norm's weights (Gemma's converter stores 1 + w)
            writer.add_tensor(name, np.ones(shape, np.float32))
        else:
            writer.add_tensor(name, (random.standard_normal(shape) * 0.02).astype(np.float16))

    add(kinds.TOKEN_EMBD, (len(tokens), width))
    add(kinds.OUTPUT_NORM, (width,))
    for block in range(layers):
        for norm in (kinds.ATTN_NORM, kinds.ATTN_POST_NORM, kinds.FFN_NORM, kinds.FFN_POST_NORM):
            add(norm, (width,), block)
        add(kinds.ATTN_Q_NORM, (head_dim,), block)
        add(kinds.ATTN_K_NORM, (head_dim,), block)
        add(kinds.ATTN_Q, (heads * head_dim, width), block)
        add(kinds.ATTN_K, (kv_heads * head_dim, width), block)
        add(kinds.ATTN_V, (kv_heads * head_dim, width), block)
        add(kinds.ATTN_OUT, (width, heads * head_dim), block)
        add(kinds.FFN_GATE, (2 * width, width), block)
        add(kinds.FFN_UP, (2 * width, width), block)
        add(kinds.FFN_DOWN, (width, 2 * width), block)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf_file


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


def save_random_llama_gguf(folder: Path, gguf_file: Path, split_max_tensors: int = 0) -> Path:
    """The random Llama of `save_random_llama` (in `folder`) written as a GGUF file, as
    llama.cpp's converter writes one: tensors under GGUF's names (gguf's own name map),
    the query and key rows permuted as llama.cpp does, float32, and the byte-level BPE
    tokenizer as a "gpt2" token list with its merges and the chat template.
    `split_max_tensors`: written split as llama.cpp's `--split-max-tensors` does
    (`NAME-00001-of-0000N.gguf`...); the first file's path is returned."""
    import json

    import gguf
    import numpy as np
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"] | {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = {t["content"] for t in tokenizer["added_tokens"] if t["special"]}
    added = {t["content"] for t in tokenizer["added_tokens"] if not t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    rope = getattr(config, "rope_theta", None) or (config.rope_parameters or {}).get(
        "rope_theta", 10000.0
    )

    def permute(weights: np.ndarray, heads: int) -> np.ndarray:
        rows = weights.shape[0] // heads // 2
        grouped = weights.reshape(heads, 2, rows, *weights.shape[1:])
        return grouped.swapaxes(1, 2).reshape(weights.shape)

    writer = gguf.GGUFWriter(str(gguf_file), "llama", split_max_tensors=split_max_tensors)
    writer.add_name(folder.name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(rope))
    writer.add_tokenizer_model("gpt2")
    # GPT-2's split before the merges, as the byte-level BPE's own (without it llama.cpp
    # splits " <" in two, and a prompt's ids differ from transformers')
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    # control, user-defined (an added tag, written as text: `<think>`), normal
    writer.add_token_types([3 if t in special else 4 if t in added else 1 for t in tokens])
    writer.add_token_merges(merges)
    if config.bos_token_id is not None:  # Qwen's have none
        writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_pad_token_id(config.pad_token_id)
    saved = folder / "chat_template.jinja"  # where transformers 5 saves it
    template = saved.read_text() if saved.exists() else settings.get("chat_template")
    writer.add_chat_template(template or CHAT_TEMPLATE)
    for name, tensor in model.state_dict().items():
        weights = tensor.float().numpy()
        if name.endswith("q_proj.weight"):
            weights = permute(weights, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            weights = permute(weights, config.num_key_value_heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"no GGUF name for {name}")
        writer.add_tensor(gguf_name, weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(gguf_file)[0]


def save_random_cross_encoder(folder: Path) -> Path:
    """A random BERT cross-encoder (one label) saved as sentence-transformers saves a
    CrossEncoder: its own `save`, after loading the plain transformers folder as users'
    cross-encoders are made. Initialised wide, so that pairs get distinct scores."""
    import tempfile

    import torch
    from sentence_transformers import CrossEncoder
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    with tempfile.TemporaryDirectory() as scratch:
        plain = Path(scratch)
        vocab = VOCAB
        tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)})
        tokenizer.save_pretrained(plain)
        torch.manual_seed(0)
        config = BertConfig(
            vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=128, num_labels=1,
            initializer_range=0.1,
        )  # fmt: skip
        BertForSequenceClassification(config).save_pretrained(plain)
        CrossEncoder(str(plain), device="cpu").save(str(folder))
    return folder


def _clip_tokenizer() -> Any:
    """A CLIP tokenizer with a byte-level alphabet and no merges (any text encodes, one
    token per character), padded to CLIP's 77 positions as Stable Diffusion's is."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<|startoftext|>", "<|endoftext|>", *alphabet, *(f"{c}</w>" for c in alphabet)]
    vocab = {token: i for i, token in enumerate(tokens)}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def _clip_text_config(hidden: int) -> Any:
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, vocab_size=2 + 2 * 256,
        hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=4,
        num_hidden_layers=2, projection_dim=hidden, max_position_embeddings=77,
    )  # fmt: skip


def _tiny_vae() -> Any:
    """Four blocks as Stable Diffusion's VAE has: its latents are 1/8 of the image a side."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=[8, 8, 16, 16], in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
        layers_per_block=1, norm_num_groups=4, sample_size=64,
    )  # fmt: skip


def save_random_sd15(folder: Path) -> Path:
    """A Stable Diffusion 1.5-shaped pipeline (UNet with cross-attention, a KL VAE whose
    latents are 1/8 a side, one CLIP text encoder, a PNDM scheduler as SD 1.5 ships),
    random and tiny (its default size is 64x64), saved with diffusers' `save_pretrained`."""
    import torch
    from diffusers import PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4,
        out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
        attention_head_dim=4, norm_num_groups=4,
    )  # fmt: skip
    scheduler = PNDMScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", skip_prk_steps=True,
        steps_offset=1, set_alpha_to_one=False,
    )  # fmt: skip
    pipeline = StableDiffusionPipeline(
        unet=unet, vae=_tiny_vae(), text_encoder=CLIPTextModel(_clip_text_config(32)),
        tokenizer=_clip_tokenizer(), scheduler=scheduler, safety_checker=None,
        feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip
    pipeline.save_pretrained(folder)
    return folder


def save_random_sdxl(folder: Path) -> Path:
    """A Stable Diffusion XL-shaped pipeline: two CLIP text encoders (the second with a
    projection, whose pooled output and the size conditioning feed the UNet's
    `text_time` embedding), an Euler scheduler as SDXL ships; random and tiny (64x64)."""
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4,
        out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4),
        use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 1), projection_class_embeddings_input_dim=6 * 8 + 32,
        cross_attention_dim=64, norm_num_groups=4,
    )  # fmt: skip
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1,
        timestep_spacing="leading",
    )  # fmt: skip
    pipeline = StableDiffusionXLPipeline(
        unet=unet, vae=_tiny_vae(), text_encoder=CLIPTextModel(_clip_text_config(32)),
        text_encoder_2=CLIPTextModelWithProjection(_clip_text_config(32)),
        tokenizer=_clip_tokenizer(), tokenizer_2=_clip_tokenizer(), scheduler=scheduler,
    )  # fmt: skip
    pipeline.save_pretrained(folder)
    return folder


VL_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def save_random_llava(folder: Path, *, context: int = 1024) -> Path:
    """A LLaVA (a CLIP vision tower, a projector and a Llama) that transformers loads as
    image-text-to-text, random and tiny: 32x32 images in 8x8 patches, 16 image tokens
    each (CLIP's class token dropped); its processor (a CLIP image processor, the
    byte-level BPE tokenizer of `save_random_llama` with an `<image>` token, a chat
    template taking content parts) saved beside it. Its end-of-text row is zeroed, as
    `save_random_llama`'s."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<pad>", "<image>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"},
    )
    tokenizer.chat_template = VL_CHAT_TEMPLATE
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    LlavaProcessor(
        image_processor=images, tokenizer=tokenizer, patch_size=8,
        vision_feature_select_strategy="default", chat_template=VL_CHAT_TEMPLATE,
        image_token="<image>", num_additional_image_tokens=1,
    ).save_pretrained(folder)  # fmt: skip
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )  # fmt: skip
    vision = CLIPVisionConfig(
        image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, projection_dim=32,
    )  # fmt: skip
    config = LlavaConfig(
        vision_config=vision, text_config=text,
        image_token_index=tokenizer.get_vocab()["<image>"],
        vision_feature_select_strategy="default", vision_feature_layer=-1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config)
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id].zero_()
    model.save_pretrained(folder)
    return folder


def llava_answers(folder: Path, question: str, tokens: int) -> Callable[[bytes], str]:
    """A vision-language model called directly, for comparison with the server: for an
    encoded image, the greedy answer to `question` about it (transformers' processor
    renders the chat with the image in it; `generate`)."""
    import io

    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype="float32").eval()

    def answer(image: bytes) -> str:
        picture = Image.open(io.BytesIO(image)).convert("RGB")
        content = [{"type": "image", "image": picture}, {"type": "text", "text": question}]
        inputs = processor.apply_chat_template(
            [{"role": "user", "content": content}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        out = model.generate(**inputs, max_new_tokens=tokens, do_sample=False)
        return str(
            processor.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        )

    return answer
