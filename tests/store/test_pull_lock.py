"""One pull of a Hub repo at a time (app.store.pull_lock), across real processes: a pull
waits for the one that holds the repo and says whom it waits for; a holder killed with
SIGKILL holds nothing, and the next pull goes on at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from app.store.progress import Progress
from app.store.pull_lock import one_pull_of
from tests.support.live import wait_until

REPO = "Org/Some-GGUF"
HOLD = """
import sys, time
from pathlib import Path
from app.store.progress import Progress
from app.store.pull_lock import one_pull_of
with one_pull_of({repo!r}, Path({models!r}), Progress()):
    print("holding", flush=True)
    time.sleep(600)
"""


class Steps(Progress):
    """The steps a pull says, kept."""

    def __init__(self) -> None:
        super().__init__()
        self.said: list[str] = []

    def step(self, text: str) -> None:
        self.said.append(text)


def holder(models: Path) -> subprocess.Popen[str]:
    """Another process holding `REPO` until it is killed."""
    code = HOLD.format(repo=REPO, models=str(models))
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    assert child.stdout is not None and child.stdout.readline() == "holding\n"
    return child


def test_a_pull_waits_for_the_holder_and_a_killed_holder_holds_nothing(tmp_path):
    models = tmp_path / "models"
    child = holder(models)
    steps, inside = Steps(), threading.Event()

    def pull() -> None:
        with one_pull_of(REPO, models, steps, poll_s=0.05):
            inside.set()

    waiting = threading.Thread(target=pull)
    try:
        waiting.start()
        wait_until(lambda: steps.said, 30, "the waiting pull's word")
        assert not inside.is_set()  # it waits while the other process holds the repo
        assert steps.said[0].startswith(f"another pull of {REPO} is under way, by process ")
        assert f"process {child.pid} (-c), since " in steps.said[0]
    finally:
        os.kill(child.pid, signal.SIGKILL)  # dies holding it: the system releases it
        child.wait()
    waiting.join(30)
    assert inside.is_set()
    assert steps.said[-1] == f"the other pull of {REPO} has ended; this one goes on"
    assert not (models / "pull-partial").exists()  # its lock, note and folder gone

    # another repo is no wait, and the same repo after a killed holder neither
    child = holder(models)
    try:
        alone = Steps()
        with one_pull_of("Org/Other-GGUF", models, alone):
            assert (models / "pull-partial" / "Org--Other-GGUF.pulling").is_file()
        assert alone.said == []
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    after = Steps()
    with one_pull_of(REPO, models, after):
        pass
    assert after.said == []
    assert not (models / "pull-partial").exists()
