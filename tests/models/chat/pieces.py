"""An answer's text pushed through a ThinkSplitter as a stream cut anywhere, for the
splitter's tests (test_reasoning, test_harmony)."""

from __future__ import annotations

from app.models.chat.reasoning import Frame, ThinkSplitter


def pieces_of(pieces: list[str], frame: Frame | None) -> list[tuple[str, str]]:
    """The (kind, text) pieces, consecutive ones of a kind joined."""
    splitter = ThinkSplitter(frame)
    found = [p for piece in pieces for p in splitter.push(piece)] + splitter.end()
    joined: list[tuple[str, str]] = []
    for kind, text in found:
        if joined and joined[-1][0] == kind:
            joined[-1] = (kind, joined[-1][1] + text)
        else:
            joined.append((kind, text))
    return joined


def cut(text: str, size: int) -> list[str]:
    """`text` in pieces of `size` characters, as a stream may give it."""
    return [text[i : i + size] for i in range(0, len(text), size)]
