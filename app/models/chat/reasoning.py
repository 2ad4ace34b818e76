"""A reasoning model's thinking: what a request asks of it, the chat template's own switch
for that, and the answer's text split into its thinking and the answer, as it streams.

The families that think in tags (Qwen3 and its successors, DeepSeek-R1 and its distills,
QwQ) write `<think>…</think>` before the answer. Their templates differ in who writes
the opening tag: Qwen3's model writes it; the R1 distills' template writes it at the end
of the prompt (`<｜Assistant｜><think>\\n`), so the answer begins inside the thinking and
holds only the closing tag. gpt-oss writes OpenAI's harmony instead: its thinking is the
`analysis` channel's message, its answer the `final` one's, a call a message to
`functions.NAME` (app.models.chat.harmony). A `Frame` says which, as the engine rendered
the prompt; every API's reply reads the answer through one `ThinkSplitter` in that frame.

Switches are each template's own: Qwen3's `enable_thinking`, gpt-oss's
`reasoning_effort` (harmony's `Reasoning: low|medium|high`). A template with neither
(the R1 distills always think) is turned off by closing the block its prompt opened.
gpt-oss has no off: off is its lowest effort (`Reasoning: low`) and a budget of 0, its
analysis closed as soon as it opens and the final answer following (no thinking comes
back). A budget ends the thinking when spent: the engine writes the closing
tag (harmony: `<|end|>` and the final message's header) and the answer follows
(llama.cpp's reasoning budget sampler; the torch engine's
app.engines.torch.generation.thinking_budget).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from app.models.chat.harmony import ANALYSIS, END, FINAL_HEADER, HarmonyReader, Kind, Piece
from app.models.tools import partial_tail

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
Effort = Literal["low", "medium", "high"]
OpenAIEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
# OpenAI's reasoning efforts as the levels templates know (gpt-oss's harmony has three)
EFFORTS: dict[OpenAIEffort, Effort | None] = {
    "none": None,
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
}


@dataclass(frozen=True)
class ThinkingAsk:
    """What a request asks of a reasoning model's thinking: on or off (None: as the
    model does by default), how hard (a level its template may know), and the most
    tokens it may take (None: the model's default budget, else no bound)."""

    on: bool | None = None
    effort: Effort | None = None
    budget: int | None = None

    @classmethod
    def from_effort(cls, effort: OpenAIEffort | None, budget: int | None = None) -> ThinkingAsk:
        """OpenAI's `reasoning_effort` (`none` turns thinking off; the others keep it on
        at that level, `minimal` and `xhigh` as the nearest a template knows)."""
        if effort is None:
            return cls(budget=budget)
        if effort == "none":
            return cls(on=False, budget=budget)
        return cls(on=True, effort=EFFORTS[effort], budget=budget)


def thinks(template: str | None) -> bool:
    """Whether a model thinks: its chat template names `<think>` tags or harmony's
    analysis channel."""
    return bool(template) and (THINK_OPEN in str(template) or harmony(template))


def harmony(template: str | None) -> bool:
    """Whether a model answers in harmony (gpt-oss): its template writes the analysis
    channel's header."""
    return bool(template) and ANALYSIS in str(template)


def template_switches(template: str | None, ask: ThinkingAsk) -> dict[str, Any]:
    """The chat template's own variables for `ask`: `enable_thinking` where it reads that
    (Qwen3), `reasoning_effort` where it reads that (gpt-oss: thinking off is its lowest
    effort, beside a budget of 0); nothing for a template with no switch (it is turned off
    otherwise: `answer_frame`)."""
    text = str(template or "")
    switches: dict[str, Any] = {}
    if ask.on is not None and "enable_thinking" in text:
        switches["enable_thinking"] = ask.on
    effort = "low" if ask.on is False and harmony(template) else ask.effort
    if effort is not None and "reasoning_effort" in text:
        switches["reasoning_effort"] = effort
    return switches


@dataclass(frozen=True)
class Frame:
    """How a model's answer carries its thinking, as its prompt was rendered: between
    `open` and `close` tags, the first already written by the prompt when `opened`; in
    harmony's messages where `harmony` (`open` and `close` are the analysis message's
    header and end, `answer` the final message's header a spent budget writes too)."""

    opened: bool = False
    open: str = THINK_OPEN
    close: str = THINK_CLOSE
    budget: int | None = None  # the most tokens it may think (None: no bound)
    harmony: bool = False
    answer: str = ""  # what follows the close tag where a budget ends the thinking

    @property
    def budget_close(self) -> str:
        """What an engine writes where the budget is spent before the thinking closed."""
        return self.close + self.answer


HARMONY = Frame(open=ANALYSIS, close=END, harmony=True, answer=FINAL_HEADER)


def answer_frame(
    template: str | None, rendered: str, ask: ThinkingAsk, default_budget: int | None = None
) -> tuple[str, Frame | None]:
    """The prompt to generate from, and the frame of its answer (None: the model does not
    think in tags), for a chat its template `rendered` with `template_switches(ask)`.

    The frame is opened where the prompt ends in an open tag (the R1 distills' template;
    Qwen3's with thinking off ends in a closed, empty block instead). Thinking off where
    the template has no switch: an opened block is closed in the prompt (the answer
    follows at once), one the model opens itself gets a budget of 0. A harmony answer
    (gpt-oss) is read in its messages; thinking off, its effort lowered by
    `template_switches` and its analysis given a budget of 0 (it cannot be switched off:
    closed at once, the final answer follows)."""
    if not thinks(template):
        return rendered, None
    if harmony(template):
        budget = ask.budget if ask.budget is not None else default_budget
        return rendered, replace(HARMONY, budget=0 if ask.on is False else budget)
    opened = rendered.rstrip().endswith(THINK_OPEN)
    if ask.on is False:
        if opened:
            return rendered + THINK_CLOSE + "\n\n", Frame()
        switched = "enable_thinking" in str(template)
        return rendered, Frame(budget=None if switched else 0)
    budget = ask.budget if ask.budget is not None else default_budget
    return rendered, Frame(opened=opened, budget=budget)


class ThinkSplitter:
    """An answer's text as it streams, split into (kind, text) pieces: a `<think>…
    </think>` at its start (after white space), or everything up to `</think>` in an
    opened frame, is thinking; the rest is text. A piece that may be the start of a tag
    waits for the next text; white space between the thinking and the text is dropped.
    Without a frame everything is text; in a harmony frame, the messages are read by
    app.models.chat.harmony's reader."""

    def __init__(self, frame: Frame | None) -> None:
        self.frame = frame or Frame()
        self.harmony = HarmonyReader() if frame is not None and frame.harmony else None
        self.state: Literal["start", "thinking", "text"] = "text"
        if frame is not None:
            self.state = "thinking" if frame.opened else "start"
        self.held = ""
        self.after_thinking = False
        self.leading = frame is not None and frame.opened  # white space before the thought

    def push(self, text: str) -> list[Piece]:
        if self.harmony is not None:
            return self.harmony.push(text)
        if self.state == "text":
            if self.after_thinking:
                text = text.lstrip()
                self.after_thinking = not text
            return [("text", text)] if text else []
        self.held += text
        if self.state == "start":
            opening = self.held.lstrip()
            if self.frame.open.startswith(opening):
                return []  # "", "<", "<thi": not known yet
            if not opening.startswith(self.frame.open):
                self.state = "text"
                return self._flush("text")
            self.state, self.held = "thinking", opening[len(self.frame.open) :]
            self.leading = True
        if self.leading:
            self.held = self.held.lstrip()
            self.leading = not self.held
        close = self.frame.close
        at = self.held.find(close)
        if at == -1:  # white space held too: a thought's last is dropped, as a whole one's
            cut = len(self.held) - partial_tail(self.held, close)
            cut = len(self.held[:cut].rstrip())
            piece, self.held = self.held[:cut], self.held[cut:]
            return [("thinking", piece)] if piece else []
        thought, rest = self.held[:at].rstrip(), self.held[at + len(close) :]
        self.state, self.held, self.after_thinking = "text", "", True
        pieces: list[Piece] = [("thinking", thought)] if thought else []
        return pieces + self.push(rest)

    def end(self) -> list[Piece]:
        """What is still held, once the answer has ended (a thought cut off by the
        token limit is thinking still)."""
        if self.harmony is not None:
            return self.harmony.end()
        if self.state == "thinking":
            return self._flush("thinking")
        return self._flush("text")

    def _flush(self, kind: Kind) -> list[Piece]:
        held, self.held = self.held, ""
        if kind == "thinking":
            held = held.rstrip()
        return [(kind, held)] if held else []


def split(text: str, frame: Frame | None) -> tuple[str, str]:
    """A whole answer's (thinking, text)."""
    splitter = ThinkSplitter(frame)
    pieces = splitter.push(text) + splitter.end()
    thought = "".join(piece for kind, piece in pieces if kind == "thinking")
    return thought, "".join(piece for kind, piece in pieces if kind == "text")
