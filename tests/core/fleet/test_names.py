"""The names apps send that no served model has (app.core.fleet.names): OpenAI's standard
names reach the served model of their kind; the Hub spellings reach the model pulled from
there (after `ollama pull hf.co/ORG/NAME[:QUANT]` Ollama's clients chat with that name)."""

from __future__ import annotations

import pytest

from app.core.fleet.names import hub_target, standard_names_of, standard_target
from app.errors import InvalidRequest

# each model's name and `pulled_from` (app.store.pull.hub_origin), in config order: two
# quantisations of one GGUF repo, a safetensors snapshot, a model of a local folder
PULLED = (
    ("tiny-q6", "hf:Org/Tiny-Chat-GGUF:Q6_K"),
    ("tiny-q4", "hf:Org/Tiny-Chat-GGUF:Q4_K_M"),
    ("snapshot", "hf:Org/Tiny-Embed"),
    ("local", None),
)


@pytest.mark.parametrize(
    ("name", "served"),
    [
        ("hf.co/Org/Tiny-Chat-GGUF:Q4_K_M", "tiny-q4"),  # as pulled
        ("hf.co/Org/Tiny-Chat-GGUF:Q6_K", "tiny-q6"),
        ("hf.co/org/tiny-chat-gguf:q4_k_m", "tiny-q4"),  # any case, repo and quant
        ("HF.CO/ORG/TINY-CHAT-GGUF:Q4_K_M", "tiny-q4"),
        ("huggingface.co/Org/Tiny-Chat-GGUF:Q4_K_M", "tiny-q4"),
        ("hf:Org/Tiny-Chat-GGUF:Q4_K_M", "tiny-q4"),
        ("hf.co/Org/Tiny-Chat-GGUF", "tiny-q6"),  # no quantisation: the first pulled
        ("hf.co/org/tiny-chat-gguf", "tiny-q6"),
        ("hf.co/Org/Tiny-Chat-GGUF:latest", "tiny-q6"),  # Ollama's tag for none
        ("hf.co/Org/Tiny-Embed", "snapshot"),
        ("hf.co/Org/Tiny-Embed:latest", "snapshot"),
        ("hf.co/Org/Tiny-Chat-GGUF:IQ3_M", None),  # a quantisation not pulled
        ("hf.co/Org/Tiny-Embed:Q4_K_M", None),  # the snapshot has no quantisation
        ("hf.co/Org/Tiny-Chat:Q4_K_M", None),  # another repo, its name a prefix
        ("hf.co/Org/Tiny-Chat-GGUF-2", None),
        ("hf.co/Other/Tiny-Chat-GGUF", None),
        ("tiny-q4", None),  # no Hub name: the served names are the fleet's own business
        ("hf.co/Org", None),
        ("", None),
    ],
)
def test_a_hub_spelling_reaches_the_model_pulled_from_there(name, served):
    assert hub_target(name, PULLED) == served


def test_without_a_quantisation_the_first_pulled_of_the_repo_in_config_order():
    assert hub_target("hf.co/Org/Tiny-Chat-GGUF", PULLED[::-1]) == "tiny-q4"
    assert hub_target("hf.co/Org/Tiny-Chat-GGUF", ()) is None


# served models (name, capabilities), in config order: two image models, two speech to
# text models, one text to speech
SERVED = (
    ("chat", ("generation",)),
    ("sd", ("image_generation",)),
    ("sdxl", ("image_generation",)),
    ("whisper", ("transcription",)),
    ("whisper-large", ("transcription",)),
    ("vits", ("speech",)),
)


@pytest.mark.parametrize(
    ("name", "models", "served"),
    [
        ("dall-e-2", SERVED, "sd"),  # several image models: the first configured
        ("gpt-image-1", SERVED, "sd"),
        ("tts-1", SERVED, "vits"),
        ("gpt-4o-mini-tts", SERVED, "vits"),
        ("", SERVED[3:4], "whisper"),  # an empty `model`: the one speech to text model
        ("tts-1", SERVED[:5], None),  # no model of its kind served
        ("gpt-4o", SERVED, None),  # no standard name
        ("whisper-1", SERVED, None),
    ],
)
def test_a_standard_name_reaches_the_served_model_of_its_kind(name, models, served):
    assert standard_target(name, models) == served


def test_an_empty_model_that_cannot_choose_between_several_is_refused_naming_them():
    with pytest.raises(InvalidRequest) as refused:
        standard_target("", SERVED)
    assert refused.value.message == (
        "an empty `model` names no speech to text model of the 2 served: name one of "
        "whisper, whisper-large (or map it to one in model_aliases)"
    )
    assert refused.value.param == "model"
    assert refused.value.details == {"models": ["whisper", "whisper-large"]}


@pytest.mark.parametrize(
    ("model", "aliases", "names"),
    [
        ("sd", {}, ["dall-e-*", "gpt-image-*"]),  # the first of several image models
        ("sdxl", {}, []),
        ("vits", {}, ["tts-*", "gpt-4o-mini-tts*"]),
        ("vits", {"tts-*": "other"}, ["gpt-4o-mini-tts*"]),  # model_aliases takes tts-*
        ("whisper", {}, []),  # an empty `model` cannot choose between two
        ("chat", {}, []),
    ],
)
def test_the_standard_names_that_reach_a_model(model, aliases, names):
    assert standard_names_of(model, SERVED, aliases) == names
    assert standard_names_of("whisper", SERVED[3:4], {}) == [""]  # the only one: reached
