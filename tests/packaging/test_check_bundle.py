"""The build-output check on fake bundles."""

from __future__ import annotations

from pathlib import Path

from check_bundle import (
    check,
    family_modules,
    main,
    missing_family_modules,
    missing_native_files,
    native_files,
)

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


def delvewheel_site(tmp_path: Path) -> Path:
    """A site-packages holding a Windows xllamacpp as delvewheel repairs it: its
    extension in the package, the DLLs it links in xllamacpp.libs beside it (RECORD's
    rows as a win_amd64 wheel lists them)."""
    site = tmp_path / "site"
    info = site / "xllamacpp-2026.10.11549.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: xllamacpp\nVersion: 2026.10.11549\n"
    )
    rows = [
        "xllamacpp/__init__.py",
        "xllamacpp/xllamacpp.cp311-win_amd64.pyd",
        "xllamacpp.libs/ggml-base-3f9a1c2e.dll",
        "xllamacpp.libs/cublas64_12-8d2e0f4a.dll",
        "xllamacpp.libs/.load-order-xllamacpp-2026.10.11549",
        "xllamacpp-2026.10.11549.dist-info/RECORD",
    ]
    (info / "RECORD").write_text("".join(f"{row},,\n" for row in rows))
    # each file installed too: importlib_metadata 8.9 (litellm imports it, and it takes
    # over the standard library's finder) lists only the RECORD's files that exist
    for row in rows[:-1]:
        (site / row).parent.mkdir(parents=True, exist_ok=True)
        (site / row).write_bytes(b"")
    return site


def test_xllamacpps_dlls_are_read_from_its_record(tmp_path):
    site = str(delvewheel_site(tmp_path))
    assert native_files("xllamacpp", [site]) == [
        "xllamacpp.libs/cublas64_12-8d2e0f4a.dll",
        "xllamacpp.libs/ggml-base-3f9a1c2e.dll",
        "xllamacpp/xllamacpp.cp311-win_amd64.pyd",
    ]
    assert native_files("no-such-distribution", [site]) == []


def test_a_bundle_without_a_dll_delvewheel_put_beside_xllamacpp_fails(tmp_path):
    expected = native_files("xllamacpp", [str(delvewheel_site(tmp_path))])
    bundle = tree(tmp_path / "vramgate", {".": ["vramgate.exe", "vramgate-cli.exe"]})
    tree(bundle / "_internal", {"xllamacpp": ["xllamacpp.cp311-win_amd64.pyd"]})
    tree(bundle / "_internal", {"xllamacpp.libs": ["ggml-base-3f9a1c2e.dll"]})
    assert missing_native_files(bundle, expected) == ["xllamacpp.libs/cublas64_12-8d2e0f4a.dll"]
    tree(bundle / "_internal", {"xllamacpp.libs": ["cublas64_12-8d2e0f4a.dll"]})
    assert missing_native_files(bundle, expected) == []  # the whole set: nothing missing
