"""The transformers families (a model folder's `model_type`) that vramgate serves, and
the transformers packages each needs. app.spec collects exactly these packages into the
bundle, packaging/check_bundle.py checks that the built bundle holds them, and `pull`
refuses a folder it could not serve: in the bundle, one outside this list; anywhere, one
transformers does not know (a model that needs its own code, which vramgate never runs).

transformers imports a model's classes by name at load time, out of PyInstaller's sight;
today's analysis happens to collect every family (transformers.models lists them all
behind TYPE_CHECKING), which no release promises: this list is what the bundle carries on
purpose. Standard library only at import: app.spec reads it in the build environment.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# sentence-transformers embedders and cross-encoders (BERT: all-MiniLM; MPNet:
# all-mpnet-base-v2; XLM-RoBERTa: bge-m3, bge-reranker, e5-multilingual; ModernBERT:
# gte-modernbert, nomic-embed v2 moe excepted; DeBERTa-v2: mxbai-rerank)
EMBEDDING_FAMILIES = (
    "bert", "mpnet", "xlm-roberta", "roberta", "distilbert", "modernbert", "camembert",
    "electra", "deberta-v2",
)  # fmt: skip
GENERATION_FAMILIES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi", "phi3",
    "gemma", "gemma2", "gemma3", "gemma3_text", "granite", "smollm3", "olmo2", "stablelm",
    "starcoder2",
)  # fmt: skip
# speech to text (app.engines.torch.speech: Whisper and its fine-tunes, distil-whisper)
SPEECH_FAMILIES = ("whisper",)
# text to speech (app.engines.torch.speech_synthesis: VITS, Meta's MMS-TTS; SpeechT5's
# text-to-speech model, Microsoft's speecht5_tts)
SPEECH_SYNTHESIS_FAMILIES = ("vits", "speecht5")
# chat with images (app.engines.torch.generation.vision_language: image-text-to-text with a
# processor)
VISION_LANGUAGE_FAMILIES = (
    "llava", "llava_next", "smolvlm", "idefics3", "qwen2_vl", "qwen2_5_vl",
)  # fmt: skip
FAMILIES = (
    EMBEDDING_FAMILIES
    + GENERATION_FAMILIES
    + SPEECH_FAMILIES
    + SPEECH_SYNTHESIS_FAMILIES
    + VISION_LANGUAGE_FAMILIES
)
# what diffusers pipelines load from transformers by class name (Stable Diffusion's and
# SDXL's text encoders and tokenizers): bundled, though `pull` takes no such folder alone
DIFFUSION_TEXT_FAMILIES = ("clip",)
BUNDLED_FAMILIES = FAMILIES + DIFFUSION_TEXT_FAMILIES
PIP_INSTALL = "pip install vramgate"


def transformers_packages(model_types: tuple[str, ...] = BUNDLED_FAMILIES) -> list[str]:
    """The `transformers.models.*` packages that loading these families imports: each
    one's own, those of the sub-models its default config holds (Gemma 3's SigLIP vision
    tower), of its tokenizer classes (Gemma 3's is Gemma's) and of its processor, image
    processor and feature extractor (Qwen2.5-VL's images are Qwen2-VL's). Needs
    transformers."""
    from transformers import CONFIG_MAPPING

    packages: set[str] = set()
    for model_type in model_types:
        config = CONFIG_MAPPING[model_type]()
        packages.update(_package(type(c)) for c in _configs(config))
        packages.update(_tokenizer_packages(model_type))
        packages.update(_processor_packages(model_type))
    return sorted(p for p in packages if p.startswith("transformers.models."))


def _configs(config: Any) -> list[Any]:
    """`config` and every config nested in it."""
    from transformers import PretrainedConfig

    nested = [v for v in vars(config).values() if isinstance(v, PretrainedConfig)]
    return [config, *(c for sub in nested for c in _configs(sub))]


def _tokenizer_packages(model_type: str) -> set[str]:
    from transformers.models.auto.tokenization_auto import (
        TOKENIZER_MAPPING_NAMES,
        tokenizer_class_from_name,
    )

    names = TOKENIZER_MAPPING_NAMES.get(model_type)
    listed = names if isinstance(names, tuple) else (names,)
    found = (tokenizer_class_from_name(n) for n in listed if n)
    return {_package(cls) for cls in found if cls is not None}


def _processor_packages(model_type: str) -> set[str]:
    from transformers.models.auto import (
        feature_extraction_auto,
        image_processing_auto,
        processing_auto,
    )

    lookups = (
        (processing_auto.PROCESSOR_MAPPING_NAMES, processing_auto.processor_class_from_name),
        (
            image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES,
            image_processing_auto.get_image_processor_class_from_name,
        ),
        (
            feature_extraction_auto.FEATURE_EXTRACTOR_MAPPING_NAMES,
            feature_extraction_auto.feature_extractor_class_from_name,
        ),
    )
    found: set[str] = set()
    for mapping, class_of in lookups:
        names = mapping.get(model_type)
        # one name, a (slow, fast) pair (transformers 5.0), or names by backend (later)
        listed = names.values() if isinstance(names, dict) else names
        for name in listed if isinstance(listed, (tuple, list, type({}.values()))) else [listed]:
            try:
                cls = class_of(name) if isinstance(name, str) else None
            except ImportError:  # it needs what is not installed (torchvision, under
                continue  # transformers 5.0's SmolVLM processor): nothing to collect
            if isinstance(cls, type):
                found.add(_package(cls))
    return found


def _package(cls: type) -> str:
    return cls.__module__.rpartition(".")[0]


PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def sees_images(path: Path) -> bool:
    """Whether `path` is a folder transformers loads as image-text-to-text (a
    vision-language model: LLaVA, Idefics3, ...): its model_type has such a class and the
    folder holds its processor's configuration. Needs transformers."""
    if not path.is_dir() or not any((path / name).is_file() for name in PROCESSOR_FILES):
        return False
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    model_type = config.get("model_type") if isinstance(config, dict) else None
    return model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def refusal(model_type: str | None, frozen: bool | None = None) -> str | None:
    """Why a folder of `model_type` cannot be served here, or None when it can."""
    frozen = getattr(sys, "frozen", False) if frozen is None else frozen
    if frozen and model_type not in FAMILIES:
        return (
            f"its model_type is {model_type!r}, which this bundle does not carry (it carries "
            f"{', '.join(FAMILIES)}); `{PIP_INSTALL}` serves every family transformers knows"
        )
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        return (
            f"its model_type is {model_type!r}, which transformers does not know: a model "
            "that ships its own code (trust_remote_code), which vramgate never runs"
        )
    return None
