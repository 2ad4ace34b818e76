"""The build-output check on fake bundles."""

from __future__ import annotations

from pathlib import Path

from check_bundle import check, family_modules, main, missing_family_modules

from tests.packaging.test_cuda_libs import CUDNN_LINUX, tree


def build_env(tmp_path: Path) -> Path:
    return tree(
        tmp_path / "site",
        {
            "nvidia/cu13/lib": ["libcublas.so.13", "libcublasLt.so.13", "libcudart.so.13"],
            "nvidia/cudnn/lib": CUDNN_LINUX,
        },
    )


def bundle_with(tmp_path: Path, site: Path, *, drop: str | None = None) -> Path:
    bundle = tmp_path / "dist" / "vramgate"
    tree(bundle, {".": ["vramgate", "vramgate-cli"], "_internal": ["base_library.zip"]})
    for lib in site.rglob("*.so*"):
        if drop is None or drop not in lib.name:
            dest = bundle / "_internal" / lib.parent.relative_to(site)
            tree(dest, {".": [lib.name]})
    return bundle


def test_complete_cuda_bundle_passes_and_reports_its_size(tmp_path, capsys):
    site = build_env(tmp_path)
    bundle = bundle_with(tmp_path, site)
    report = check(bundle, "cuda", site, "linux")
    assert report.errors == [] and report.cuda_libraries == 11 and report.files == 14
    assert (
        main(
            [
                str(bundle),
                "--flavour",
                "cuda",
                "--site",
                str(site),
                "--platform",
                "linux",
                "--skip-modules",
            ]
        )
        == 0
    )
    assert "bundle check passed" in capsys.readouterr().out


def test_bundle_without_a_cudnn_sub_library_fails(tmp_path, capsys):
    site = build_env(tmp_path)
    bundle = bundle_with(tmp_path, site, drop="libcudnn_engines_precompiled")
    assert (
        main(
            [
                str(bundle),
                "--flavour",
                "cuda",
                "--site",
                str(site),
                "--platform",
                "linux",
                "--skip-modules",
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert "missing from the bundle: nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9" in out


def test_bundle_without_cudnn_at_all_fails(tmp_path):
    site = build_env(tmp_path)
    bundle = bundle_with(tmp_path, site, drop="libcudnn")
    report = check(bundle, "cuda", site, "linux")
    assert report.errors and "libcudnn.so.9" in report.errors[0]


def test_a_driver_library_in_the_bundle_fails(tmp_path):
    bundle = tree(
        tmp_path / "vramgate", {".": ["vramgate", "vramgate-cli"], "_internal": ["libcuda.so.1"]}
    )
    report = check(bundle, "cpu", tmp_path, "linux")
    assert report.errors == ["driver libraries must not be bundled: libcuda.so.1"]


def test_a_cuda_build_environment_without_cuda_is_reported(tmp_path):
    bundle = tree(tmp_path / "vramgate", {".": ["vramgate", "vramgate-cli"]})
    report = check(bundle, "cuda", tmp_path / "empty-site", "linux")
    assert "the build environment has no cublas library" in report.errors


def test_a_bundle_without_its_console_executable_fails(tmp_path):
    bundle = tree(tmp_path / "vramgate", {".": ["vramgate.exe"], "_internal": ["python311.dll"]})
    report = check(bundle, "cpu", tmp_path, "windows")
    assert report.errors == [f"no executable at {bundle / 'vramgate-cli.exe'}"]


def test_the_module_check_names_a_family_the_bundle_lacks():
    """The families `pull` accepts, as the build environment has their modules: a bundle
    without MPNet's modeling module (all-mpnet-base-v2) fails the check, naming it."""
    from app.engines.torch.families import transformers_packages

    expected = family_modules(transformers_packages())
    assert "transformers.models.mpnet.modeling_mpnet" in expected
    assert "transformers.models.siglip.modeling_siglip" in expected  # Gemma 3's vision tower
    assert "transformers.models.xlm_roberta.tokenization_xlm_roberta" in expected
    assert missing_family_modules(expected, set(expected)) == []
    lacking = set(expected) - {"transformers.models.mpnet.modeling_mpnet"}
    assert missing_family_modules(expected, lacking) == ["transformers.models.mpnet.modeling_mpnet"]
