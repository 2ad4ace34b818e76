"""Audio in: an uploaded file decoded by PyAV (ffmpeg's demuxers and decoders: wav, flac,
mp3, ogg, webm, m4a, ...) to 16 kHz mono float32, and cut into Whisper's 30-second
windows. Pure CPU work, run on the CPU pool before anything is queued; a file that is
no audio, or longer than the limit, is refused here (400).

Only audio containers are opened: ffmpeg's probe would also pick a playlist (its concat
demuxer, HLS), which opens the files or URLs it names, so an upload could read the
server's own media files and tell which exist. PyAV passes ffmpeg the demuxers it may
pick (`format_whitelist`) and the protocols any of them may open (`protocol_whitelist`,
one that names nothing: the upload is read from memory and no allowed demuxer opens
another file); a playlist is then no format ffmpeg knows, the same 400 whatever it
names."""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from app.errors import AudioMemoryFull, AudioTooLong, InvalidAudio
from app.sched.host_bytes import HostLease

SAMPLE_RATE = 16_000
WINDOW_S = 30  # Whisper's input: 30 seconds, 3,000 mel frames
WINDOW_SAMPLES = WINDOW_S * SAMPLE_RATE
# a container's declared duration may be a little short of what decodes (mp3's estimate):
# decoding stops this far past the limit, so a file that lies cannot decode without end
DECODE_SLACK_S = 5.0
AUDIO_RETRY_S = 10  # Retry-After when decoded audio is at its bound: a few windows' run

Task = Literal["transcribe", "translate"]

# the demuxers an upload may be opened by, as ffmpeg names them (a demuxer passes if one
# of its names is here: "matroska,webm", "mov,mp4,m4a,3gp,3g2,mj2"); none opens a file
# an upload names (mov's external references are off unless `enable_drefs` is set)
AUDIO_DEMUXERS = ("wav", "w64", "flac", "mp3", "ogg", "matroska", "mov", "aac", "aiff", "caf")
OPEN_OPTIONS = {
    "format_whitelist": ",".join(AUDIO_DEMUXERS),
    "protocol_whitelist": "none",  # no protocol: a demuxer that opens a name fails
}


@dataclass(frozen=True)
class SpeechOptions:
    """What decodes a window's text; windows of equal options share a `generate` call."""

    task: Task = "transcribe"
    language: str | None = None  # an ISO-639-1 code; None: the model detects it per window
    prompt: str | None = None  # text of a previous window, to continue its style
    temperature: float = 0.0  # 0: greedy
    words: bool = False  # each word's times too (cross-attention alignment, DTW)


@dataclass(frozen=True)
class AudioClip:
    """An uploaded file, still encoded, with the longest duration it may have."""

    data: bytes
    max_seconds: float
    options: SpeechOptions = SpeechOptions()
    # its request's share of max_audio_bytes: the decoded samples are taken from it
    # (None: unbounded, the model's own warm-up and probe)
    lease: HostLease | None = None
    # set when its request stops (its client left, the server stopping): its windows
    # still to run are skipped
    stop: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)


@dataclass(frozen=True)
class Window:
    """Up to 30 seconds of a clip: its samples and where it starts in the clip."""

    samples: np.ndarray  # float32, 16 kHz mono
    start_s: float
    options: SpeechOptions
    stop: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)

    @property
    def end_s(self) -> float:
        return self.start_s + self.samples.size / SAMPLE_RATE

    @property
    def span(self) -> tuple[float, float]:
        return self.start_s, self.end_s


def _too_long(seconds: float, limit: float) -> AudioTooLong:
    return AudioTooLong(
        f"the audio lasts {seconds:.1f} s; at most {limit:g} s are accepted (max_audio_seconds)",
        param="file",
    )


def audio_memory_full(nbytes: int, lease: HostLease) -> AudioMemoryFull:
    """The 503 for `nbytes` more than a lease's ledger has room for."""
    return AudioMemoryFull(
        f"audio held by transcriptions is at its bound (max_audio_bytes); this file "
        f"needs {nbytes / 2**20:.1f} MiB more; retry shortly",
        retry_after=AUDIO_RETRY_S,
        details={"held_bytes": lease.held},
    )


def _taken(lease: HostLease | None, nbytes: int) -> None:
    if lease is not None and not lease.take(nbytes):
        raise audio_memory_full(nbytes, lease)


def decode_audio(data: bytes, max_seconds: float, lease: HostLease | None = None) -> np.ndarray:
    """The first audio stream of `data` as 16 kHz mono float32. The container's declared
    duration is checked before decoding; decoding stops past the limit too. With a
    `lease`, every decoded piece is taken from it as it comes (and the joined samples
    beside them while they are joined): past its ledger's bound, 503 `audio_memory_full`;
    the samples stay taken until the lease closes."""
    import av

    try:
        container = av.open(io.BytesIO(data), mode="r", options=dict(OPEN_OPTIONS))
    except (av.error.FFmpegError, ValueError, OSError):
        raise InvalidAudio("the file is not audio that can be decoded", param="file") from None
    with container:
        if not container.streams.audio:
            raise InvalidAudio("the file has no audio stream", param="file")
        stream = container.streams.audio[0]
        if container.duration is not None and container.duration / av.time_base > max_seconds:
            raise _too_long(container.duration / av.time_base, max_seconds)
        return _decoded(container, stream, max_seconds, lease)


def _decoded(
    container: object, stream: object, max_seconds: float, lease: HostLease | None
) -> np.ndarray:
    import av

    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
    bound = int((max_seconds + DECODE_SLACK_S) * SAMPLE_RATE)
    pieces: list[np.ndarray] = []
    total = 0
    try:
        for frame in container.decode(stream):  # type: ignore[attr-defined]
            for out in resampler.resample(frame):
                pieces.append(out.to_ndarray().reshape(-1))
                _taken(lease, pieces[-1].nbytes)
                total += pieces[-1].size
            if total > bound:
                raise _too_long(total / SAMPLE_RATE, max_seconds)
        for out in resampler.resample(None):
            pieces.append(out.to_ndarray().reshape(-1))
            _taken(lease, pieces[-1].nbytes)
    except av.error.FFmpegError:
        raise InvalidAudio("the audio could not be decoded", param="file") from None
    samples = _joined(pieces, lease)
    if samples.size == 0:
        raise InvalidAudio("the file holds no audio samples", param="file")
    if samples.size / SAMPLE_RATE > max_seconds:
        raise _too_long(samples.size / SAMPLE_RATE, max_seconds)
    return samples.astype(np.float32, copy=False)


def _joined(pieces: list[np.ndarray], lease: HostLease | None) -> np.ndarray:
    """The pieces as one float32 array; while it is made both are held (and taken)."""
    pieces_bytes = sum(piece.nbytes for piece in pieces)
    _taken(lease, pieces_bytes)  # the joined copy: the same size in float32
    samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    pieces.clear()
    if lease is not None:
        lease.give(pieces_bytes)
    return samples.astype(np.float32, copy=False)


def windows(
    samples: np.ndarray, options: SpeechOptions, stop: threading.Event | None = None
) -> list[Window]:
    """`samples` cut into consecutive 30-second windows, the last one shorter, sharing
    their clip's `stop`."""
    stop = stop if stop is not None else threading.Event()
    return [
        Window(samples[start : start + WINDOW_SAMPLES], start / SAMPLE_RATE, options, stop)
        for start in range(0, samples.size, WINDOW_SAMPLES)
    ]
