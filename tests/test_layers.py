"""The layers of app/, read from the imports as written (lazy ones included): every
import runs down the stack of docs/layout.md's Layout, the engines never import one another,
and torch is imported only by the torch engine and the devices that hold its tensors.

How each would fail: an upward or sideways import (a route helper imported by the core,
the torch engine reaching into llama.cpp's) is named with its file; a new `import torch`
outside the allowed files, or a module of the core or the routes whose imports pull
torch in (the Device base once held a torch.device, so 23 of 33 route modules loaded
torch), is named too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# From the top down; a module may import its own layer and the layers below it.
LAYERS: list[tuple[str, ...]] = [
    ("app.__main__", "app.cli", "app.cluster"),
    ("app.api",),
    ("app.store",),
    ("app.core",),
    ("app.engines",),
    ("app.models",),
    ("app.devices",),
    ("app.sched",),
    ("app.config", "app.observe", "app.process", "app.errors", "app"),
]
ENGINES = ("app.engines.torch", "app.engines.llama_cpp", "app.engines.simulated")
# Where `import torch` may stand: the torch engine, the devices whose memory torch
# measures or holds, and the simulated model, which raises torch's own out-of-memory
# error (the class the real engine's models raise) when a fault is injected.
TORCH_ALLOWED = (
    "app/engines/torch/",
    "app/devices/cpu.py",
    "app/devices/cuda.py",
    "app/devices/simulated.py",
    "app/devices/torch_backed.py",
    "app/devices/choose.py",
    "app/engines/simulated/model.py",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def app_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / "app").rglob("*.py"))}


def imports_of(path: Path, *, typing_too: bool = True) -> set[str]:
    """Every module `path` imports, at any depth; `typing_too=False` leaves out what is
    imported only for type checkers (under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    if not typing_too:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped |= {id(n) for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def layer_of(module: str) -> int | None:
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


def engine_of(module: str) -> str | None:
    return next((e for e in ENGINES if module == e or module.startswith(e + ".")), None)


def test_every_import_runs_down_the_layers_and_the_engines_stay_apart():
    modules = app_modules()
    wrong = []
    for name, path in modules.items():
        mine = layer_of(name)
        assert mine is not None, f"{name} is in no layer: add it to LAYERS and docs/layout.md"
        for target in imports_of(path):
            if target not in modules:  # a name imported from a module, or a library
                continue
            theirs = layer_of(target)
            assert theirs is not None
            if theirs < mine:
                wrong.append(f"{name} imports {target}, a layer above it")
            engine, other = engine_of(name), engine_of(target)
            if engine and other and engine != other:
                wrong.append(f"{name} imports {target}, another engine's")
    assert not wrong, "\n".join(wrong)


def test_torch_is_imported_only_by_the_torch_engine_and_the_devices_that_need_it():
    found = sorted(
        str(path.relative_to(ROOT))
        for path in app_modules().values()
        if any(m == "torch" or m.startswith("torch.") for m in imports_of(path, typing_too=False))
    )
    stray = [f for f in found if not f.startswith(TORCH_ALLOWED)]
    assert not stray, f"torch imported outside the torch engine and its devices: {stray}"
    assert "app/engines/torch/generation/step_batch.py" in found  # the scan sees imports


def test_the_core_the_routes_and_the_contract_load_without_torch():
    """Imported together in a fresh interpreter, as `serve` imports them before any
    model loads, nothing pulls torch (or transformers) in."""
    heavy = ("app.engines.torch", "app.engines.simulated", "app.cluster")
    allowed_devices = {"app.devices." + f.split("/")[-1][:-3] for f in TORCH_ALLOWED[1:6]}
    light = [
        name
        for name in app_modules()
        if not name.startswith(heavy) and name not in allowed_devices and name != "app.__main__"
    ]
    assert "app.api.openai.routes" in light and "app.core.service" in light
    code = (
        "import sys\n"
        f"for name in {light!r}:\n"
        "    __import__(name)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_no_folder_of_app_holds_more_than_15_modules():
    """A folder of more than ~15 modules wants sub-packages by what they do (STYLE 11)."""
    crowded = {
        folder.relative_to(ROOT).as_posix(): count
        for folder in [ROOT / "app", *(p.parent for p in (ROOT / "app").rglob("__init__.py"))]
        if (count := len(list(folder.glob("*.py")))) > 15
    }
    assert not crowded, f"folders past 15 modules: {crowded}"
