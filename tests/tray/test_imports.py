"""The tray stays light: it never imports torch or the engine."""

from __future__ import annotations

import subprocess
import sys


def test_tray_never_imports_torch_or_the_engine():
    code = (
        "import sys, tray.app, tray.menu, tray.monitor, tray.supervisor, app.cli; "
        "heavy = [m for m in sys.modules if m == 'torch' or m.startswith('app.engine') "
        "or m.startswith('transformers')]; print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
