"""Build-output check, run after every build; needs no GPU.

    python packaging/check_bundle.py dist/vramgate --flavour cuda [--site SITE_PACKAGES]

For the CUDA flavour: every CUDA library the build environment has (cuBLAS, cuBLASLt,
cudart, each cuDNN sub-library, ...) is in the bundle at its package-relative place; for
every flavour: both executables are there, no driver library is, the size is reported,
and (unless --skip-modules) the bundle's Python archive holds the configuration, modeling
and tokenization modules of every transformers family `pull` accepts
(app.engines.torch.families), read from the archive PyInstaller built, as the bundle imports them,
and every shared library xllamacpp installed (its extension; on Windows the DLLs delvewheel
put in xllamacpp.libs) at its site-packages-relative place.
Exit status 1 on any problem.
"""

from __future__ import annotations

import argparse
import importlib.util
import pkgutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # app.engines.torch.families
from cuda_libs import Platform, is_driver, missing_groups, select_libraries


@dataclass
class Report:
    size_bytes: int = 0
    files: int = 0
    cuda_libraries: int = 0
    family_modules: int = 0
    errors: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = [
            f"bundle size {self.size_bytes / 2**20:.0f} MiB in {self.files} files; "
            f"{self.cuda_libraries} CUDA libraries; {self.family_modules} transformers family "
            "modules"
        ]
        lines += [f"ERROR: {error}" for error in self.errors]
        lines.append("bundle check " + ("FAILED" if self.errors else "passed"))
        return "\n".join(lines)


def contents_dir(bundle: Path) -> Path:
    """PyInstaller 6 puts everything but the executable under `_internal`."""
    internal = bundle / "_internal"
    return internal if internal.is_dir() else bundle


def check(bundle: Path, flavour: str, site: Path, platform: Platform) -> Report:
    report = Report()
    suffix = ".exe" if platform == "windows" else ""
    for name in ("vramgate", "vramgate-cli"):  # the double-click one, the console one
        exe = bundle / f"{name}{suffix}"
        if not exe.is_file():
            report.errors.append(f"no executable at {exe}")
    files = [p for p in bundle.rglob("*") if p.is_file()]
    report.files = len(files)
    report.size_bytes = sum(p.stat().st_size for p in files)
    drivers = sorted(p.name for p in files if is_driver(p.name, platform))
    if drivers:
        report.errors.append(f"driver libraries must not be bundled: {', '.join(drivers)}")
    if flavour == "cuda":
        expected = select_libraries(site, platform)
        for group in missing_groups(expected):
            report.errors.append(f"the build environment has no {group} library")
        root = contents_dir(bundle)
        absent = [
            f"{lib.dest}/{lib.name}"
            for lib in expected
            if not (root / lib.dest / lib.name).is_file()
        ]
        if absent:
            report.errors.append(f"missing from the bundle: {', '.join(absent)}")
        report.cuda_libraries = len(expected) - len(absent)
    return report


FAMILY_MODULES = ("configuration_", "modeling_", "tokenization_")


def family_modules(packages: list[str]) -> list[str]:
    """The modules of these transformers packages that loading a model imports, as this
    build environment has them."""
    found = []
    for package in packages:
        spec = importlib.util.find_spec(package)
        where = list(spec.submodule_search_locations or []) if spec else []
        found += [
            f"{package}.{module.name}"
            for module in pkgutil.iter_modules(where)
            if module.name.startswith(FAMILY_MODULES)
        ]
    return sorted(found)


def bundled_modules(bundle: Path, platform: Platform) -> set[str]:
    """The Python modules in the bundle's archive (PYZ), as its executables import them."""
    from PyInstaller.archive.readers import CArchiveReader

    exe = bundle / ("vramgate-cli.exe" if platform == "windows" else "vramgate-cli")
    archive = CArchiveReader(str(exe))
    name = next(n for n in archive.toc if n.endswith(".pyz"))
    return set(archive.open_embedded_archive(name).toc)


def missing_family_modules(expected: list[str], bundled: set[str]) -> list[str]:
    return [module for module in expected if module not in bundled]


def check_modules(bundle: Path, platform: Platform, report: Report) -> None:
    from app.engines.torch.families import transformers_packages

    expected = family_modules(transformers_packages())
    missing = missing_family_modules(expected, bundled_modules(bundle, platform))
    if missing:
        report.errors.append(f"transformers modules missing from the bundle: {', '.join(missing)}")
    report.family_modules = len(expected) - len(missing)


NATIVE_SUFFIXES = (".dll", ".pyd", ".so", ".dylib")
NATIVE_DISTRIBUTIONS = ("xllamacpp",)  # llama.cpp's engine: its extension and, on Windows,
# the DLLs delvewheel put beside it in xllamacpp.libs (PyInstaller's analysis does not
# follow delvewheel's directory: app.spec collects it by name)


def native_files(distribution: str, site: list[str] | None = None) -> list[str]:
    """The shared libraries and extension modules a distribution installed (its RECORD),
    as paths relative to site-packages; none if it is not installed. `site`: where to
    look, else `sys.path`."""
    from importlib.metadata import Distribution

    found = next(iter(Distribution.discover(name=distribution, path=site or sys.path)), None)
    listed = (found.files or []) if found is not None else []
    return sorted(
        str(path) for path in listed if path.suffix in NATIVE_SUFFIXES or ".so." in path.name
    )


def missing_native_files(bundle: Path, expected: list[str]) -> list[str]:
    root = contents_dir(bundle)
    return [path for path in expected if not (root / path).is_file()]


def check_native(bundle: Path, report: Report) -> None:
    for distribution in NATIVE_DISTRIBUTIONS:
        missing = missing_native_files(bundle, native_files(distribution))
        if missing:
            report.errors.append(
                f"{distribution}'s libraries missing from the bundle: {', '.join(missing)}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--flavour", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--site", type=Path, default=Path(sysconfig.get_paths()["purelib"]))
    parser.add_argument(
        "--platform",
        choices=("windows", "linux"),
        default="windows" if sys.platform == "win32" else "linux",
    )
    parser.add_argument(
        "--skip-modules",
        action="store_true",
        help="skip the checks against the build environment's packages (transformers' "
        "family modules, xllamacpp's libraries)",
    )
    args = parser.parse_args(argv)
    report = check(args.bundle, args.flavour, args.site, args.platform)
    if not args.skip_modules:
        check_modules(args.bundle, args.platform, report)
        check_native(args.bundle, report)
    print(report.text())
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
