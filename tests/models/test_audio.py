"""Audio decoding (app.models.audio) on real files PyAV writes here: only audio
containers are opened. A playlist (ffmpeg's concat demuxer, HLS) names other files for
ffmpeg to open; an upload of one must be refused, and refused the same whether the file it
names exists or not, or the upload both reads the server's files and tells which exist."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.errors import AudioMemoryFull, InvalidAudio
from app.models.audio import SAMPLE_RATE, decode_audio
from app.sched.host_bytes import HostBytes
from tests.support.random_whisper import CODECS, tone, write_encoded, write_wav


@pytest.fixture
def secret(tmp_path, monkeypatch) -> Path:
    """A 2-second WAV at Music/secret.wav under the working directory (as a tray started
    from a desktop runs in the home folder)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Music").mkdir()
    return write_wav(tmp_path / "Music" / "secret.wav", tone(2.0))


PLAYLISTS = {
    "ffconcat": "ffconcat version 1.0\nfile Music/{name}\n",
    "hls": "#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:2.0,\nMusic/{name}\n#EXT-X-ENDLIST\n",
    "m3u": "#EXTM3U\n#EXTINF:2,secret\nMusic/{name}\n",
}


def refusal(data: bytes) -> str:
    with pytest.raises(InvalidAudio) as refused:
        decode_audio(data, 60.0)
    return str(refused.value)


@pytest.mark.parametrize("playlist", sorted(PLAYLISTS))
def test_a_playlist_naming_a_local_file_is_refused_as_if_the_file_were_absent(secret, playlist):
    named = PLAYLISTS[playlist].format(name=secret.name).encode()
    absent = PLAYLISTS[playlist].format(name="absent.wav").encode()
    assert refusal(named) == refusal(absent)
    # the valid twin: the file itself, uploaded, decodes
    assert decode_audio(secret.read_bytes(), 60.0).size == 2 * SAMPLE_RATE


@pytest.mark.parametrize("suffix", ["wav", *sorted(CODECS)])
def test_every_audio_container_we_claim_still_decodes(tmp_path, suffix):
    path = tmp_path / f"clip.{suffix}"
    if suffix == "wav":
        write_wav(path, tone(3.0))
    else:
        write_encoded(path, tone(3.0))
    samples = decode_audio(path.read_bytes(), 60.0)
    assert samples.dtype == np.float32 and abs(samples.size / SAMPLE_RATE - 3.0) < 0.1


def test_decoded_samples_are_taken_from_the_lease_and_come_back_when_it_closes(tmp_path):
    data = write_wav(tmp_path / "clip.wav", tone(10.0)).read_bytes()
    ledger = HostBytes(4 * 2**20)
    with ledger.lease() as lease:
        samples = decode_audio(data, 60.0, lease)
        assert lease.held == samples.nbytes == ledger.held  # the pieces were given back
    assert ledger.held == 0


def test_audio_that_would_pass_the_bound_is_a_503_with_retry_after(tmp_path):
    data = write_wav(tmp_path / "clip.wav", tone(10.0)).read_bytes()  # 640 KB decoded
    ledger = HostBytes(2**20)  # joining needs twice that: 1.28 MB
    with ledger.lease() as lease, pytest.raises(AudioMemoryFull) as full:
        decode_audio(data, 60.0, lease)
    assert full.value.status == 503 and full.value.headers()["Retry-After"] == "10"
    assert ledger.held == 0  # what it took came back with its lease
    with ledger.lease() as lease:  # the valid twin: a shorter clip fits
        assert decode_audio(write_wav(tmp_path / "s.wav", tone(4.0)).read_bytes(), 60, lease).size
