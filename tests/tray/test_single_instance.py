"""One tray per user: a second process cannot take the lock while the first holds it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tray.single_instance import acquire


def other_process_gets_the_lock(lock_dir) -> bool:
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from tray.single_instance import acquire
        sys.exit(0 if acquire(Path({str(lock_dir)!r})) else 1)
    """)
    return subprocess.run([sys.executable, "-c", script], timeout=60).returncode == 0


def test_second_instance_is_refused_until_the_first_lets_go(tmp_path):
    lock = acquire(tmp_path)
    assert lock is not None
    assert not other_process_gets_the_lock(tmp_path)
    lock.release()
    assert other_process_gets_the_lock(tmp_path)


def test_a_dead_holder_never_blocks_the_next_start(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time; from pathlib import Path; from tray.single_instance import acquire; "
            f"lock = acquire(Path({str(tmp_path)!r})); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    assert acquire(tmp_path) is None
    holder.kill()
    holder.wait()
    assert acquire(tmp_path) is not None
