"""packaging/ is a folder of build scripts, not a package (a top-level `packaging` package
would shadow the library pip and PyInstaller import), so tests load it from its path."""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"
if str(PACKAGING) not in sys.path:
    sys.path.insert(0, str(PACKAGING))
