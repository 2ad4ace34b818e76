"""Generation's shared pieces: buckets and context limits, stop strings across steps."""

from __future__ import annotations

import pytest

from app.errors import ContextLengthExceeded
from app.models.decoding import SamplingParams, StopScanner, generation_prepared


def test_bucket_covers_the_worst_case_and_the_default_cap_is_cut_to_the_context():
    prepared = generation_prepared("m", [1] * 20, SamplingParams(max_tokens=100), 1024, 512)
    assert prepared.bucket.label == "p32t128" and prepared.payload.max_tokens == 100
    capped = generation_prepared("m", [1] * 1000, SamplingParams(), 1024, 512)
    assert capped.payload.max_tokens == 24 and capped.bucket.label == "p1024t1024"
    default = generation_prepared("m", [1] * 3, SamplingParams(), 1024, 512)
    assert default.payload.max_tokens == 512


def test_max_tokens_asked_past_the_context_is_refused_naming_both_numbers():
    with pytest.raises(ContextLengthExceeded) as refused:
        generation_prepared("m", [1] * 1000, SamplingParams(max_tokens=500), 1024, 512)
    message = refused.value.message  # OpenAI's words, which litellm recognises, and ours
    assert message.startswith("This model's maximum context length is 1024 tokens. However, ")
    assert "you requested 1500 tokens (1000 in the messages, 500 in the completion)" in message
    assert "at most 24" in message and refused.value.param == "max_tokens"
    anthropic = refused.value.anthropic_message  # as Anthropic's API says it
    assert anthropic.startswith("input length and `max_tokens` exceed context limit: 1000 + 500")
    assert refused.value.ollama_message.startswith("the input length exceeds the context length")


def test_prompt_that_fills_the_context_is_refused_with_the_numbers():
    with pytest.raises(ContextLengthExceeded) as refused:
        generation_prepared("m", [1] * 1024, SamplingParams(), 1024, 512)
    assert refused.value.message.startswith(
        "This model's maximum context length is 1024 tokens. However, your messages resulted "
        "in 1024 tokens."
    )
    anthropic = refused.value.anthropic_message
    assert anthropic.startswith("prompt is too long: 1024 tokens > 1024 maximum")


def test_stop_string_split_across_steps_is_held_back_then_cut():
    scanner = StopScanner(("END",))
    sent = [scanner.push(text) for text in ("Hello E", "Hello EN", "Hello END and more")]
    assert sent == ["Hello ", "", ""]
    assert scanner.stopped and scanner.text == "Hello "


def test_the_stop_string_that_ended_the_text_is_named_the_earliest_of_several():
    scanner = StopScanner(("END", "\n\n", "x"))
    assert scanner.push("ab\n") == "ab" and scanner.matched is None  # "\n" may begin one
    scanner.push("ab\n\ncd END x")
    assert scanner.stopped and scanner.matched == "\n\n" and scanner.text == "ab"


def test_false_alarm_prefix_is_released_and_broken_utf8_waits():
    scanner = StopScanner(("END",))
    assert scanner.push("an E") == "an "
    assert scanner.push("an Ex") == "Ex"
    plain = StopScanner(())
    assert plain.push("caf\ufffd") == "caf"
    assert plain.push("café") == "é"
    assert plain.push("café!", final=True) == "!"


TEXTS = [
    "The capital of France is Paris, and its café serves crème brûlée.",
    "A dragon 🐉 learns to bake bread; it's 3.14 times harder than it looks!",
    "Ünïcödé  spaces\tand\nnew lines",
]


def tokenizers(tmp_path):
    """Two real tokenizers that spell text differently: a byte-level BPE (a token may
    be half a UTF-8 character) and BERT's WordPiece (## pieces, spaces between words)."""
    from transformers import AutoTokenizer

    from app.engines.torch.embedding import embedded_model_path
    from tests.support.random_models import save_random_llama

    bpe = save_random_llama(tmp_path / "bpe", context=64)
    minilm = embedded_model_path()
    return [AutoTokenizer.from_pretrained(bpe), AutoTokenizer.from_pretrained(minilm)]


def test_incremental_text_ends_as_the_whole_decode_and_only_ever_grows(tmp_path):
    from app.models.decoding import IncrementalText

    for tokenizer in tokenizers(tmp_path):
        calls: list[int] = []

        def decode(ids: list[int], tokenizer=tokenizer, calls=calls) -> str:
            calls.append(len(ids))
            return tokenizer.decode(ids, skip_special_tokens=True)

        for text in TEXTS:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            calls.clear()
            incremental, seen = IncrementalText(decode), ""
            for end in range(1, len(ids) + 1):
                now = incremental.extend(ids[:end])
                assert now.startswith(seen) and "\ufffd" not in now
                seen = now
            whole = tokenizer.decode(ids, skip_special_tokens=True)
            assert seen == whole
            # each step decodes a short window, never the whole answer again
            assert max(calls) <= 8 and sum(calls) <= 6 * len(ids)
