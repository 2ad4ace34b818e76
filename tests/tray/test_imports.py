"""The tray stays light: it never imports torch, the engines' handlers, the devices or
the core (it talks to the server over HTTP only)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = (
    "torch",
    "transformers",
    "diffusers",
    "xllamacpp",
    "app.core",
    "app.devices",
    "app.api",
    "app.engines.table",
    "app.engines.torch",
    "app.engines.simulated",
    "app.engines.llama_cpp.runner_model",
)


def test_tray_never_imports_torch_or_the_engine():
    code = (
        "import sys, tray.app, tray.menu, tray.monitor, tray.supervisor, app.cli; "
        f"heavy = [m for m in sys.modules if m.startswith({HEAVY!r})]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
