"""gpt-oss's answers in OpenAI's harmony format, read as they stream: its messages, each a
header and a body, split into the thinking (the `analysis` channel), the answer (`final`,
and a `commentary` preamble) and tool calls (a message to `functions.NAME`).

The grammar is llama.cpp's (common/chat.cpp, `common_chat_parse_gpt_oss`). The prompt
ends in `<|start|>assistant`, so the answer begins with the first message's header:

    <|channel|>analysis<|message|>THOUGHT<|end|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>

and a call names its recipient after the channel or before it (the form the template
renders earlier calls in):

    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>

A message ends at `<|end|>`, or where the answer ends (`<|return|>` and `<|call|>` end
the generation: the engines leave them out of the text). A call's message is given as
the text the call reader reads (app.models.tools: `<tool_call>{"name", "arguments"}
</tool_call>`), whole, once its message has ended; a header that is none of these is
skipped to the next `<|start|>`, as llama.cpp does. Text before any header is answer
text (a model that wrote no harmony at all).
"""

from __future__ import annotations

import json
import re
from typing import Literal

from app.models.tools import partial_tail

# an answer's pieces, as every reader of thinking gives them (app.models.chat.reasoning)
Kind = Literal["thinking", "text"]
Piece = tuple[Kind, str]

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
ENDS = (END, "<|return|>", "<|call|>")  # a message's ends (the last two end the answer)
# what the engines must give back as text: the torch engine keeps them where it leaves
# out other special tokens; llama.cpp renders them itself (its vocabulary's rule for
# gpt-oss's tokens, src/llama-vocab.cpp: without `preserved_tokens` on xllamacpp 2026.10)
MARKERS = (START, END, MESSAGE, CHANNEL, "<|constrain|>")
ANALYSIS = f"{CHANNEL}analysis{MESSAGE}"
FINAL_HEADER = f"{START}assistant{CHANNEL}final{MESSAGE}"
_RECIPIENT = r"to=functions\.([^<\s]+)"
_CALL_BEFORE = re.compile(rf"^\s*(?:assistant)?\s*{_RECIPIENT}\s*{re.escape(CHANNEL)}")
_CALL_AFTER = re.compile(rf"{re.escape(CHANNEL)}(?:analysis|commentary)\s+{_RECIPIENT}")
_CHANNEL = re.compile(rf"{re.escape(CHANNEL)}(analysis|final|commentary)\b")

Body = Literal["thinking", "text", "call", "skip"]


class HarmonyReader:
    """A harmony answer as it streams, as (kind, text) pieces: `thinking` for analysis,
    `text` for the answer and for each call (in the call reader's form). A body's tail
    that may be the start of `<|end|>` or `<|start|>` waits for the next text."""

    def __init__(self) -> None:
        self.held = ""
        self.body: Body | None = None  # None: in a header (the first one: the prompt's)
        self.call = ""  # the recipient of the message being read, where it is a call
        self.first = True  # no message read yet: text before a header is the answer's

    def push(self, text: str) -> list[Piece]:
        self.held += text
        pieces: list[Piece] = []
        while True:
            if self.body is None:
                if not self._header():
                    return pieces
            elif not self._body(pieces):
                return pieces

    def end(self) -> list[Piece]:
        """What is still held, once the answer has ended: a body cut off by the end of
        the answer (`<|return|>`, `<|call|>`, the token limit) ends with it."""
        held, self.held = self.held, ""
        if self.body is None:  # no header finished: a model that wrote no harmony
            text = held if self.first else ""
            return [("text", text)] if text and START not in text else []
        return self._ended(held)

    def _header(self) -> bool:
        """Read a header if one is whole (True: go on with its body)."""
        at = self.held.find(MESSAGE)
        if at == -1:
            return False
        header, self.held = self.held[:at], self.held[at + len(MESSAGE) :]
        if START in header:  # a message after another: its header follows the last start
            header = header[header.rfind(START) + len(START) :]
        self.first = False
        called = _CALL_BEFORE.search(header) or _CALL_AFTER.search(header)
        channel = _CHANNEL.search(header)
        if called:
            self.body, self.call = "call", called.group(1)
        elif channel is None:
            self.body = "skip"  # llama.cpp's recovery: on to the next message
        else:
            self.body = "thinking" if channel.group(1) == "analysis" else "text"
        return True

    def _body(self, pieces: list[Piece]) -> bool:
        """Give out a body's text up to its end (True: it ended, a header follows)."""
        found = [(self.held.find(mark), mark) for mark in (*ENDS, START)]
        ends = [(at, mark) for at, mark in found if at != -1]
        if not ends:
            kind = self._kind()
            if kind is not None:
                keep = max(partial_tail(self.held, mark) for mark in (*ENDS, START))
                cut = len(self.held) - keep
                if cut:
                    pieces.append((kind, self.held[:cut]))
                    self.held = self.held[cut:]
            return False
        at, mark = min(ends)
        body, self.held = self.held[:at], self.held[at:]
        if mark in ENDS:
            self.held = self.held[len(mark) :]
        pieces.extend(self._ended(body))
        self.body, self.call = None, ""
        return True

    def _ended(self, body: str) -> list[Piece]:
        """The pieces of a message's last text (a call's whole message)."""
        if self.body == "call":
            return [("text", _call_text(self.call, body))]
        kind = self._kind()
        return [(kind, body)] if kind is not None and body else []

    def _kind(self) -> Kind | None:
        """The kind of piece the message being read gives out as it streams (None: a
        call's, given whole at its end, or one skipped)."""
        if self.body == "thinking":
            return "thinking"
        return "text" if self.body == "text" else None


def _call_text(name: str, arguments: str) -> str:
    """A harmony call as the call reader reads one (its arguments as the model wrote
    them where they are no JSON: the reader then finds no call)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return f"<tool_call>{arguments}</tool_call>"
    return "<tool_call>" + json.dumps({"name": name, "arguments": value}) + "</tool_call>"
