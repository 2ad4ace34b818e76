"""A pull cancelled (app.store.progress.EventProgress with its `cancel` set): its next
step or chunk raises PullCancelled, which the download passes on at once (a lost
connection is tried again; a cancel is not), keeping what came."""

from __future__ import annotations

import threading

import pytest

from app.store.hub import download_file, file_url
from app.store.progress import EventProgress, PullCancelled
from tests.support.hub import Hub

REPO, FILE = "Org/Some-GGUF", "some-Q4_0.gguf"


def test_a_cancelled_progress_stops_the_next_step_or_chunk():
    cancel, events = threading.Event(), []
    progress = EventProgress(events.append, cancel=cancel)
    progress.begin("downloading", 100)
    progress.advance(10)
    cancel.set()
    with pytest.raises(PullCancelled, match="pulling it again resumes it"):
        progress.advance(10)
    with pytest.raises(PullCancelled):
        progress.step("converting")
    assert [e.get("completed") for e in events] == [0, 10]


def test_a_cancel_is_not_tried_again_and_what_came_is_kept(tmp_path):
    content = bytes(range(256)) * 4096  # 1 MiB
    with Hub() as hub:
        hub.add(REPO, {FILE: content})
        url = file_url(hub.url, REPO, hub.commit(REPO), FILE)
        cancel = threading.Event()
        progress = EventProgress(lambda event: None, cancel=cancel)
        progress.begin("downloading", len(content))

        def advance(nbytes: int) -> None:
            progress.advance(nbytes)
            cancel.set()  # after the first chunk

        local = tmp_path / FILE
        with pytest.raises(PullCancelled):
            download_file(url, local, len(content), {}, advance)
        gets = [path for path in hub.paths if path.endswith(FILE)]
    assert len(gets) == 1  # not tried again, as a lost connection is
    assert 0 < local.stat().st_size < len(content)  # the first chunk, kept
    assert content.startswith(local.read_bytes())
