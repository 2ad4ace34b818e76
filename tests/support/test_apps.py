"""The end-to-end tests' apps installed ahead (`python -m tests.support.apps DIR`, which
may run while the tests do): a finished install is taken as it is, one under way in a
live process is waited for and never emptied by a second installer, and one whose
installer died half-way is made again. Real processes hold the marks. One that fails
fails its test in CI, naming the app, and skips it only outside CI."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support import apps
from tests.support.live import _install


def installer(folder: Path, seconds: float, finish: bool) -> subprocess.Popen:
    """A process that marks `folder` as its install in progress (as `apps._marked`
    does) for `seconds`, then leaves the command and the finished mark (`finish`) or
    just ends, its mark left behind."""
    binary = apps.pip_command(folder, "app")
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from tests.support import apps
        folder = Path({str(folder)!r})
        assert apps._claim(folder)
        Path({str(folder / "started")!r}).write_text("")
        time.sleep({seconds})
        if {finish}:
            Path({str(binary)!r}).parent.mkdir(parents=True, exist_ok=True)
            Path({str(binary)!r}).write_text("")
            (folder / {apps.INSTALLING!r}).unlink()
            (folder / {apps.COMPLETE!r}).write_text("")
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script])
    while not (folder / "started").exists():
        assert process.poll() is None, "the installer ended before it marked its folder"
        time.sleep(0.05)
    return process


def made_here(folder: Path, calls: list[str]):
    """The test's own install, as `apps.install_pip` makes one (marked), counted."""

    def make() -> str | None:
        calls.append("made")
        binary = apps.pip_command(folder, "app")
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_text("")
        return None

    return lambda: apps._marked(folder, make)


def test_an_install_under_way_is_waited_for_and_then_taken(tmp_path):
    folder, calls = tmp_path / "app", []
    process = installer(folder, 3, finish=True)
    _install(folder, apps.pip_command(folder, "app"), made_here(folder, calls))
    # it was waited for: its installer had finished (it ends a moment after its mark)
    assert (folder / apps.COMPLETE).exists() and process.wait(10) == 0
    assert calls == []  # and its install taken, not made again
    assert apps.installed(folder, apps.pip_command(folder, "app"))


def test_a_second_installer_leaves_a_live_ones_folder_alone(tmp_path):
    folder, calls = tmp_path / "app", []
    process = installer(folder, 30, finish=True)
    try:
        assert made_here(folder, calls)() == apps.BUSY
        assert calls == [] and (folder / "started").exists()  # nothing emptied
    finally:
        process.kill()
        process.wait()


def test_an_install_whose_installer_died_is_made_again(tmp_path):
    folder, calls = tmp_path / "app", []
    installer(folder, 0.2, finish=False).wait(10)
    assert (folder / apps.INSTALLING).exists()  # its mark outlived it
    _install(folder, apps.pip_command(folder, "app"), made_here(folder, calls))
    assert calls == ["made"]
    assert apps.installed(folder, apps.pip_command(folder, "app"))
    assert not (folder / "started").exists()  # the half-made folder was emptied first
    # the positive control: a finished install is taken at once, made no more
    _install(folder, apps.pip_command(folder, "app"), made_here(folder, calls), wait_s=0)
    assert calls == ["made"]


@pytest.mark.parametrize(
    ("ci", "outcome"),
    [
        ("true", pytest.fail.Exception),  # GitHub Actions', GitLab's and .ci/run's
        ("1", pytest.fail.Exception),
        ("", pytest.skip.Exception),  # a developer's machine: skipped, saying why
        ("false", pytest.skip.Exception),
    ],
)
def test_an_app_that_cannot_be_installed_fails_in_ci_and_skips_elsewhere(
    tmp_path, monkeypatch, ci, outcome
):
    folder, failed = tmp_path / "aider", "aider-chat==0.86.2 could not be installed: offline"
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match=r"^aider was not installed.*: aider-chat==0\.86\.2 could"):
        _install(
            folder, apps.pip_command(folder, "aider"), lambda: apps._marked(folder, lambda: failed)
        )
    assert not apps.installed(folder, apps.pip_command(folder, "aider"))
