"""A thinking budget on the torch engine, as llama.cpp's reasoning budget sampler keeps
one (common/reasoning-budget): the tokens after the open tag are counted, and once the
budget is spent before the close tag came, the close tag's tokens are written in place
of what the model samples, one a step (harmony's: `<|end|>` and the final message's
header after it); the answer then follows as the model goes on.

Pure token bookkeeping: the row feeds it every token it chose and writes what it gives
back (app.engines.torch.generation.step_batch)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from app.models.chat.reasoning import Frame


@dataclass
class ThinkingBudget:
    """One row's thinking: not yet begun (the model has not written `start`), counting
    (`spent` of `budget`), closing (`end`'s tokens still to write), or over."""

    budget: int
    start: tuple[int, ...]
    end: tuple[int, ...]
    closing: tuple[int, ...]  # what a spent budget writes: `end`, and what follows it
    counting: bool = False  # the block is open (the prompt may have opened it)
    spent: int = 0
    over: bool = False  # the block has closed, by the model or by the budget
    forced: list[int] = field(default_factory=list)  # the close tag's tokens still to write
    recent: list[int] = field(default_factory=list)  # the last tokens, to find a tag in

    @classmethod
    def of(cls, frame: Frame, tokens: Callable[[str], list[int]]) -> ThinkingBudget | None:
        """The budget of an answer in `frame` (None: unbounded); `tokens` spells a tag."""
        if frame.budget is None:
            return None
        start, end = tuple(tokens(frame.open)), tuple(tokens(frame.close))
        closing = tuple(tokens(frame.budget_close))
        return cls(frame.budget, start, end, closing, counting=frame.opened)

    def next(self, sampled: int) -> int:
        """The token to write where `sampled` was chosen."""
        if self.forced:  # all of the closing, past the end tag in it
            return self._write(self.forced.pop(0))
        if self.over:
            return sampled
        if self.counting and self.spent >= self.budget:
            self.forced = list(self.closing)
            return self._write(self.forced.pop(0))
        self._saw(sampled)
        if self.counting and not self.over:
            self.spent += 1
        elif not self.counting and self._ends_with(self.start):
            self.counting = True
        return sampled

    def _write(self, token: int) -> int:
        self._saw(token)
        return token

    def _saw(self, token: int) -> None:
        self.recent = [*self.recent, token][-max(len(self.start), len(self.end), 1) :]
        if self.counting and self._ends_with(self.end):
            self.over = True

    def _ends_with(self, tag: tuple[int, ...]) -> bool:
        return bool(tag) and tuple(self.recent[-len(tag) :]) == tag
