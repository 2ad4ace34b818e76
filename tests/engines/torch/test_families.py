"""app.engines.torch.families: the transformers families the bundle carries and pull accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engines.torch.families import (
    FAMILIES,
    GENERATION_FAMILIES,
    SPEECH_FAMILIES,
    VISION_LANGUAGE_FAMILIES,
    refusal,
    transformers_packages,
)

ROOT = Path(__file__).resolve().parents[3]


def test_app_spec_collects_the_list_pull_reads():
    spec = (ROOT / "app.spec").read_text()
    assert "from app.engines.torch.families import transformers_packages" in spec
    assert "for package in FAMILY_PACKAGES for module in family_modules(package)" in spec


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_module_a_family_builds_comes_from_a_collected_package(model_type):
    """Each family's model, built from its default config on the meta device (no
    weights), as the embedding, rerank and generation handlers build it: every module
    class in it, and its tokenizer classes, come from a package the bundle collects
    (Gemma 3's vision tower from SigLIP's)."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSpeechSeq2Seq,
    )

    config = AutoConfig.for_model(model_type)
    if not hasattr(config, "pad_token_id"):  # transformers 5.0's Phi and StableLM defaults
        config.pad_token_id = None  # lack it, and their models read it
    text = getattr(config, "text_config", None)
    if text is not None and (text.pad_token_id or 0) >= getattr(text, "vocab_size", 1 << 62):
        # transformers 5.0's SmolVLM and Idefics3 defaults pad past their own vocabulary
        # ("Padding_idx must be within num_embeddings"): only the module classes matter here
        text.pad_token_id = None
    classes = AutoModelForCausalLM if model_type in GENERATION_FAMILIES else AutoModel
    if model_type in SPEECH_FAMILIES:  # as app.engines.torch.speech loads it
        classes = AutoModelForSpeechSeq2Seq
    # as app.engines.torch.generation.vision_language loads it
    if model_type in VISION_LANGUAGE_FAMILIES:
        classes = AutoModelForImageTextToText
    with torch.device("meta"):
        if model_type == "gemma3":  # Gemma 3 >= 4B: the text model and its SigLIP tower
            from transformers import Gemma3ForConditionalGeneration

            model = Gemma3ForConditionalGeneration(config)
        else:
            model = classes.from_config(config)
    used = {type(m).__module__.rpartition(".")[0] for m in model.modules()}
    used = {p for p in used if p.startswith("transformers.models.")}
    assert used <= set(transformers_packages((model_type,))), used
    assert used <= set(transformers_packages())


def test_pull_accepts_the_families_and_refuses_the_rest_in_the_bundle():
    for model_type in FAMILIES:
        assert refusal(model_type, frozen=True) is None
        assert refusal(model_type, frozen=False) is None
    assert "does not carry" in (refusal("t5", frozen=True) or "")
    assert refusal("t5", frozen=False) is None  # a pip install serves what transformers has
    assert "does not know" in (refusal("new", frozen=False) or "")


@pytest.mark.parametrize(
    ("model_type", "package"),
    [
        ("qwen2_5_vl", "transformers.models.qwen2_vl"),  # Qwen2.5-VL's images: Qwen2-VL's
        ("idefics3", "transformers.models.idefics3"),
    ],
)
def test_a_familys_processor_package_is_collected(model_type, package):
    """What loading a speech or vision-language folder's processor imports by name."""
    from transformers.models.auto import image_processing_auto

    name = image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
    listed = (
        name.values() if isinstance(name, dict) else name if isinstance(name, tuple) else [name]
    )
    try:
        for each in listed:
            if isinstance(each, str):
                image_processing_auto.get_image_processor_class_from_name(each)
    except ImportError as exc:  # transformers 5.0's Qwen2-VL processor needs torchvision
        pytest.skip(f"its image processor does not import here: {exc}")
    assert package in transformers_packages((model_type,))
