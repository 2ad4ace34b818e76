"""A text to speak split into parts: at sentence ends, the first sentence alone (heard
soonest), the others joined up to the limit, a sentence past the limit cut at spaces."""

from __future__ import annotations

from app.api.audio.parts import PART_CHARS, split_parts


def test_sentences_split_the_first_alone_and_the_rest_joined_up_to_the_limit():
    text = "One. Two is here! Three? Four…\nFive.  Six。Seven"
    assert split_parts(text, limit=20) == [
        "One.",
        "Two is here! Three?",
        "Four… Five. Six。",
        "Seven",
    ]
    assert split_parts("No end at all") == ["No end at all"]


def test_a_sentence_past_the_limit_is_cut_at_spaces_and_nothing_is_lost():
    words = " ".join(f"word{i}" for i in range(200))
    parts = split_parts(words + ". Then a short one.")
    assert all(len(part) <= PART_CHARS for part in parts)
    assert " ".join(parts) == words + ". Then a short one."
    assert split_parts("x" * 450, limit=200) == ["x" * 200, "x" * 200, "x" * 50]


def test_whitespace_only_input_stays_one_part():
    assert split_parts("   ") == ["   "]
