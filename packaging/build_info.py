"""Build-time resources for app.spec: the icon and the Windows version resource."""

from __future__ import annotations

import sys
from pathlib import Path

VERSION_TEMPLATE = """VSVersionInfo(
  ffi=FixedFileInfo(filevers={tup}, prodvers={tup}, mask=0x3f, flags=0x0, OS=0x40004,
                    fileType=0x1, subtype=0x0, date=(0, 0)),
  kids=[
    StringFileInfo([StringTable('040904B0', [
      StringStruct('CompanyName', 'vramgate'),
      StringStruct('FileDescription', 'vramgate: local GPU inference server'),
      StringStruct('FileVersion', '{version}'),
      StringStruct('InternalName', 'vramgate'),
      StringStruct('OriginalFilename', 'vramgate.exe'),
      StringStruct('ProductName', 'vramgate'),
      StringStruct('ProductVersion', '{version}')])]),
    VarFileInfo([VarStruct('Translation', [1033, 1200])])
  ]
)
"""


def version_file(version: str, out_dir: Path) -> Path:
    parts = [int(p) for p in version.split(".")[:3] if p.isdigit()]
    tup = tuple(parts + [0] * (4 - len(parts)))
    path = out_dir / "version_info.txt"
    path.write_text(VERSION_TEMPLATE.format(tup=tup, version=version), encoding="utf-8")
    return path


def icon_file(root: Path, out_dir: Path) -> Path:
    """The ready-state tray icon at the sizes Windows asks for."""
    sys.path.insert(0, str(root))
    from tray.icon import render
    from tray.view import IconView

    image = render(IconView("ready", 0.6, 0), size=256)
    path = out_dir / "vramgate.ico"
    image.save(path, sizes=[(16, 16), (24, 24), (32, 32), (48, 48), (64, 64), (256, 256)])
    return path
