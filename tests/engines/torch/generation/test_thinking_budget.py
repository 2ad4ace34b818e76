"""A thinking budget on the torch engine: counted from the open tag (or from the start
where the prompt opened the block), the close tag written in place of the sampled
tokens once it is spent, nothing touched after the block closed or without a budget."""

from __future__ import annotations

from app.engines.torch.generation.thinking_budget import ThinkingBudget
from app.models.chat.reasoning import Frame

OPEN, CLOSE = 1, 2  # `<think>` and `</think>` as one token each
TAGS = {"<think>": [OPEN], "</think>": [CLOSE], "<t>": [7, 8], "</t>": [7, 9]}
# harmony's: the analysis header, its end, and its end with the final message's header
TAGS |= {"<a>": [30, 31], "<e>": [32], "<e><f>": [32, 33, 34]}


def written(frame: Frame, sampled: list[int]) -> list[int]:
    budget = ThinkingBudget.of(frame, TAGS.__getitem__)
    assert budget is not None
    return [budget.next(token) for token in sampled]


def test_the_close_tag_replaces_the_token_after_the_budget_and_the_answer_follows():
    sampled = [OPEN, 10, 11, 12, 13, 14, 15]
    assert written(Frame(budget=3), sampled) == [OPEN, 10, 11, 12, CLOSE, 14, 15]


def test_an_opened_block_is_counted_from_the_first_token_and_a_budget_of_0_closes_it_at_once():
    assert written(Frame(opened=True, budget=2), [10, 11, 12, 13]) == [10, 11, CLOSE, 13]
    assert written(Frame(opened=True, budget=0), [10, 11]) == [CLOSE, 11]


def test_a_thought_closed_within_its_budget_is_left_alone():
    sampled = [OPEN, 10, CLOSE, 20, 21, 22, 23]
    assert written(Frame(budget=3), sampled) == sampled
    assert written(Frame(budget=3), [20, 21, 22, 23, 24]) == [20, 21, 22, 23, 24]  # no thought


def test_a_close_tag_of_several_tokens_is_written_one_a_step():
    budget = ThinkingBudget.of(Frame(open="<t>", close="</t>", budget=1), TAGS.__getitem__)
    assert budget is not None
    got = [budget.next(token) for token in [7, 8, 10, 11, 12, 13]]
    assert got == [7, 8, 10, 7, 9, 13]


def test_harmonys_spent_budget_writes_the_end_and_the_final_header_whole():
    frame = Frame(open="<a>", close="<e>", answer="<f>", budget=2, harmony=True)
    got = written(frame, [30, 31, 10, 11, 12, 13, 14, 15, 16])
    assert got == [30, 31, 10, 11, 32, 33, 34, 15, 16]
    # an analysis that ends itself within its budget (a call after it) is left alone
    assert written(frame, [30, 31, 10, 32, 40, 41, 42]) == [30, 31, 10, 32, 40, 41, 42]


def test_no_budget_is_no_bookkeeping():
    assert ThinkingBudget.of(Frame(), TAGS.__getitem__) is None
