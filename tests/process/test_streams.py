"""The windowed executable's entry: Python gives it stdout and stderr None. Run as the
bundle's `vramgate.exe` would be, in a process of its own with both streams None."""

from __future__ import annotations

import subprocess
import sys

from tests.support.live import clean_env

ENTRY = (
    "import runpy, sys; sys.stdout = None; sys.stderr = None; "
    "sys.argv = ['vramgate', *sys.argv[1:]]; runpy.run_module('app', run_name='__main__')"
)


def windowed(tmp_path, *args: str) -> tuple[int, str]:
    env = clean_env() | {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run(
        [sys.executable, "-c", ENTRY, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout == "" and done.stderr == ""  # nothing reached the real streams
    logs = list(tmp_path.rglob("console.log"))
    return done.returncode, logs[0].read_text() if logs else ""


def test_help_and_errors_go_to_the_console_log_not_a_missing_stream(tmp_path):
    code, written = windowed(tmp_path, "--help")
    assert code == 0 and "usage: vramgate" in written
    code, written = windowed(tmp_path, "pull", str(tmp_path / "nothing-here"))
    assert code == 1 and "vramgate pull: " in written and "is not a local folder" in written


def test_a_pull_with_its_progress_bar_runs_without_streams(tmp_path):
    source = tmp_path / "src" / "m"
    source.mkdir(parents=True)
    (source / "config.json").write_text('{"architectures": ["BertModel"], "model_type": "bert"}')
    (source / "weights.bin").write_bytes(bytes(3 * 2**20))
    config = tmp_path / "config.toml"
    code, written = windowed(
        tmp_path, "pull", str(source), "--config", str(config), "--models-dir", str(tmp_path / "md")
    )
    assert code == 0, written
    assert "copying m" in written and "pulled m (embedding)" in written
    assert (tmp_path / "md" / "m" / "weights.bin").stat().st_size == 3 * 2**20
