"""The view of a runner's /slots: which tags its slots hold and whether its work moved.
The answers are llama.cpp's own, as xllamacpp 2026.10.11549 gave them here (a busy slot
of a 4-slot runner mid-answer; trimmed of sampling params we do not read)."""

from __future__ import annotations

import copy

from app.engines.llama_cpp.slots import FIRST_TAG, TAG_FIELD, SlotsView, tags

IDLE = {"id": 0, "n_ctx": 2048, "speculative": False, "is_processing": False}
BUSY = {
    "id": 3,
    "n_ctx": 2048,
    "speculative": False,
    "is_processing": True,
    "id_task": 0,
    "n_prompt_tokens": 546,
    "n_prompt_tokens_processed": 541,
    "n_prompt_tokens_cache": 0,
    "params": {"seed": 12345, "n_predict": 64, TAG_FIELD: 2000000007},
    "next_token": [{"has_next_token": True, "has_new_line": True, "n_remain": 59, "n_decoded": 5}],
}


def test_a_busy_slot_holds_its_tag_and_an_idle_one_none():
    view = SlotsView.of([IDLE, BUSY])
    assert view.holds(2000000007)
    assert not view.holds(2000000008)
    assert not SlotsView.of([IDLE]).holds(2000000007)


def test_a_slot_that_let_go_of_its_request_holds_it_no_more():
    done = {**copy.deepcopy(BUSY), "is_processing": False}
    assert not SlotsView.of([IDLE, done]).holds(2000000007)


def test_work_moved_when_a_token_was_decoded_and_not_between_two_equal_looks():
    before = SlotsView.of([IDLE, BUSY])
    again = SlotsView.of([IDLE, copy.deepcopy(BUSY)])
    later = copy.deepcopy(BUSY)
    later["next_token"][0]["n_decoded"] = 6
    assert not again.moved_since(before)
    assert SlotsView.of([IDLE, later]).moved_since(before)
    assert SlotsView.of([IDLE]).moved_since(before)  # the request ended
    assert before.moved_since(None)  # a first answer: the loop turned


def test_an_answer_that_is_not_a_list_of_slots_holds_nothing():
    assert SlotsView.of({"error": "x"}).busy == ()
    assert SlotsView.of(None).busy == ()


def test_tags_are_distinct_and_far_from_the_fields_usual_values():
    given = tags()
    first, second = next(given), next(given)
    assert first == FIRST_TAG and second == FIRST_TAG + 1
