"""Speech out, encoded as OpenAI's `/v1/audio/speech` answers: `mp3`, `opus` (in Ogg),
`aac` (ADTS), `flac`, `wav` and `pcm`, every one 24 kHz mono as OpenAI's are (`pcm`:
raw 16-bit signed little-endian samples, no header). PyAV (ffmpeg's encoders and muxers)
encodes as the parts of a request are spoken: each part's bytes can be sent at once,
and the container is written to a sink that cannot seek, so what was sent is never
rewritten (a streamed WAV's sizes are left unset, as ffmpeg writes them for a pipe; every
decoder reads to the end). Pure CPU work, run on the CPU pool."""

from __future__ import annotations

import io
from typing import Any, Literal

import numpy as np

OUT_RATE = 24_000  # OpenAI's: every format, and pcm's documented rate
SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
FORMATS: tuple[str, ...] = ("mp3", "opus", "aac", "flac", "wav", "pcm")
# (container, codec, sample format the codec takes) per response format
CODECS: dict[str, tuple[str, str, str]] = {
    "mp3": ("mp3", "libmp3lame", "s16p"),
    "opus": ("ogg", "libopus", "s16"),
    "aac": ("adts", "aac", "fltp"),
    "flac": ("flac", "flac", "s16"),
    "wav": ("wav", "pcm_s16le", "s16"),
}
MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


class _Sink(io.RawIOBase):
    """Where the muxer writes: bytes gathered until taken; no seeking."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self._chunks = b"".join(self._chunks), []
        return out


class SpeechEncoder:
    """One response's audio: `feed` each part's samples as it is spoken, `close` at the
    end; each call gives the bytes to send now. Not thread-safe: one response's calls
    come one after another."""

    def __init__(self, response_format: SpeechFormat) -> None:
        import av

        self.format = response_format
        self.samples = 0  # at OUT_RATE, fed so far
        self._resampler: Any = None
        self._rate = 0
        self._container: Any = None
        if response_format == "pcm":
            return
        container, codec, sample_format = CODECS[response_format]
        self._sink = _Sink()
        options = {"page_duration": "100000"} if container == "ogg" else {}  # pages of 0.1 s
        self._container = av.open(self._sink, mode="w", format=container, options=options)
        self._stream = self._container.add_stream(codec, rate=OUT_RATE)
        self._stream.layout = "mono"
        self._sample_format = sample_format

    def feed(self, samples: np.ndarray, rate: int) -> bytes:
        """`samples` (float32 mono at `rate`) resampled to 24 kHz and encoded."""
        import av

        if self._resampler is None or rate != self._rate:
            target = "s16" if self._container is None else self._sample_format
            self._resampler = av.AudioResampler(format=target, layout="mono", rate=OUT_RATE)
            self._rate = rate
        frame = av.AudioFrame.from_ndarray(
            np.clip(samples, -1.0, 1.0).reshape(1, -1).astype(np.float32), format="flt",
            layout="mono",
        )  # fmt: skip
        frame.sample_rate = rate
        return self._encode(self._resampler.resample(frame))

    def close(self) -> bytes:
        """The resampler's and the encoder's last samples, and the container's end."""
        tail = self._encode(self._resampler.resample(None)) if self._resampler is not None else b""
        if self._container is None:
            return tail
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return tail + self._sink.take()

    def _encode(self, frames: list[Any]) -> bytes:
        self.samples += sum(frame.samples for frame in frames)
        if self._container is None:  # pcm: the resampler's s16 samples as they are
            return b"".join(bytes(frame.planes[0])[: frame.samples * 2] for frame in frames)
        for frame in frames:
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._sink.take()


def encode_all(parts: list[tuple[np.ndarray, int]], response_format: SpeechFormat) -> bytes:
    """Every part encoded, in order, as one file."""
    encoder = SpeechEncoder(response_format)
    return b"".join(encoder.feed(samples, rate) for samples, rate in parts) + encoder.close()
