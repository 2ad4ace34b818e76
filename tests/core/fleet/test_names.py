"""The Hub spellings a model name reaches its pulled model by (app.core.fleet.names):
after `ollama pull hf.co/ORG/NAME[:QUANT]` Ollama's clients chat with that name."""

from __future__ import annotations

import pytest

from app.core.fleet.names import hub_target

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
