"""A transcript: each window's decoded text and timed segments, and a whole clip's,
assembled from its windows in order. Times are seconds from the clip's start."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    text: str


@dataclass(frozen=True)
class WindowText:
    """One window's output: its whole text, and its segments already placed in the clip
    (offset by the window's start, within the window's audio)."""

    start_s: float
    end_s: float
    text: str
    segments: tuple[Segment, ...]
    words: tuple[Segment, ...] = ()  # only where word timestamps were asked for
    task: str = "transcribe"
    language: str | None = None
    temperature: float = 0.0


@dataclass(frozen=True)
class Transcript:
    text: str
    segments: tuple[Segment, ...]
    words: tuple[Segment, ...]
    duration: float
    task: str
    language: str | None
    temperature: float
    windows: int

    @classmethod
    def of(cls, rows: list[WindowText]) -> Transcript:
        """A clip's windows, in order, as one transcript."""
        first = rows[0]
        return cls(
            text="".join(row.text for row in rows),
            segments=tuple(segment for row in rows for segment in row.segments),
            words=tuple(word for row in rows for word in row.words),
            duration=rows[-1].end_s,
            task=first.task,
            language=first.language,
            temperature=first.temperature,
            windows=len(rows),
        )


def placed(start: float, end: float, window_start: float, window_end: float) -> tuple[float, float]:
    """A segment's times within its window (seconds from the window's start) as seconds
    from the clip's start, kept within the window's audio: Whisper sees the padding past
    a short window's end as silence, and may stamp segments there."""
    first = min(max(window_start + start, window_start), window_end)
    last = min(max(window_start + end, first), window_end)
    return round(first, 3), round(last, 3)
