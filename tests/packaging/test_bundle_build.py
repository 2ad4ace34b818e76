"""The bundle, built for real: the CPU flavour here, with the same three steps the
Windows workflow runs (pyinstaller app.spec, check_bundle.py, smoke_test.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.random_models import (
    save_random_llama,
    save_random_llama_gguf,
    save_random_llava,
    save_random_sd15,
)
from tests.support.random_speecht5 import save_random_speecht5
from tests.support.random_vits import save_random_vits
from tests.support.random_whisper import save_random_whisper, tone, write_encoded

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "windows-bundle.yml"
STEPS = ("pyinstaller app.spec", "packaging/check_bundle.py", "packaging/smoke_test.py")


def pyinstaller(tmp_path: Path, flavour: str) -> subprocess.CompletedProcess:
    env = os.environ | {"VRAMGATE_FLAVOUR": flavour}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "PyInstaller",
            "app.spec",
            "--noconfirm",
            "--distpath",
            str(tmp_path / "dist"),
            "--workpath",
            str(tmp_path / "build"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)  # PyInstaller's analysis of the whole venv: 2.5 min before the
# cluster extra's packages were installed beside it, several minutes since
def test_cpu_bundle_builds_checks_serves_embeddings_and_chats_with_a_pulled_gguf(tmp_path):
    started = time.monotonic()
    build = pyinstaller(tmp_path, "cpu")
    build_s = time.monotonic() - started
    assert build.returncode == 0, build.stderr[-3000:]
    bundle = tmp_path / "dist" / "vramgate"
    check = subprocess.run(
        [sys.executable, "packaging/check_bundle.py", str(bundle), "--flavour", "cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout
    model = save_random_llama(tmp_path / "tiny-chat", context=256)
    gguf = save_random_llama_gguf(model, tmp_path / "tiny-chat.gguf")
    whisper = save_random_whisper(tmp_path / "tiny-whisper")
    audio = write_encoded(tmp_path / "clip.flac", tone(3.0, seed=1))
    diffusion = save_random_sd15(tmp_path / "tiny-sd")
    vision = save_random_llava(tmp_path / "tiny-vl")
    speech = ["--whisper", str(whisper), "--audio", str(audio), "--diffusion", str(diffusion)]
    tts = save_random_vits(tmp_path / "tiny-tts")
    speecht5 = save_random_speecht5(tmp_path / "tiny-t5-tts")
    speech += ["--vision", str(vision), "--tts", str(tts), "--tts", str(speecht5)]
    smoke = subprocess.run(
        [sys.executable, "packaging/smoke_test.py", str(bundle), "--gguf", str(gguf), *speech],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert smoke.returncode == 0, smoke.stderr
    figures = json.loads(smoke.stdout)
    assert figures["embedding_dims"] == 384 and figures["exit_code"] == 0
    assert figures["chat_chunks"] >= 2 and figures["pip"].startswith("pip ")
    assert figures["gguf_engine"] == "llama.cpp"  # the bundle carries the engine
    # pull takes the Whisper folder as speech; PyAV decodes the FLAC, Whisper transcribes it
    assert figures["whisper_kind"] == "speech" and figures["audio_duration_s"] == 3.0
    # diffusers and the CLIP text encoder it loads by name: one image drawn
    assert figures["diffusion_kind"] == "diffusion" and figures["image_bytes"] > 100
    # a LLaVA (its CLIP vision tower and image processor, imported by name) sees a PNG
    assert figures["vision_kind"] == "generation" and figures["vision_finish"] == "length"
    # a VITS and a SpeechT5 (their transformers packages collected through FAMILIES,
    # SentencePiece with its metadata) each speak a sentence
    kinds = {"tiny-tts": "speech_synthesis", "tiny-t5-tts": "speech_synthesis"}
    assert figures["tts_kinds"] == kinds
    assert min(figures["speech_seconds"].values()) > 0.2, figures["speech_seconds"]
    print(
        f"\nbundle: built in {build_s:.0f}s; {check.stdout.splitlines()[0]}; "
        f"ready in {figures['time_to_ready_s']}s; GGUF pulled in {figures['gguf_pull_s']}s"
    )
    shutil.rmtree(tmp_path / "build", ignore_errors=True)


def test_cuda_flavour_without_cuda_libraries_stops_with_a_clear_message(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA libraries")
    build = pyinstaller(tmp_path, "cuda")
    assert build.returncode != 0
    assert "the CUDA flavour was asked for" in build.stderr
    assert "install the CUDA build of torch" in build.stderr
    assert not (tmp_path / "dist" / "vramgate").exists()


def test_windows_workflow_runs_the_same_steps_and_lints_clean():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    runs = [step.get("run", "") for step in workflow["jobs"]["bundle"]["steps"]]
    for command in STEPS:
        assert any(command in run for run in runs), command
    smoke = next(run for run in runs if "packaging/smoke_test.py" in run)
    for option in ("--gguf", "--whisper", "--audio", "--diffusion", "--vision", "--tts"):
        assert option in smoke, option  # the CUDA bundle is smoke-tested as this one is
    assert workflow["jobs"]["bundle"]["runs-on"].startswith("windows")
    actionlint = shutil.which("actionlint", path=os.path.dirname(sys.executable))
    assert actionlint, "actionlint comes with the test extras"
    lint = subprocess.run([actionlint, str(WORKFLOW)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


def test_windows_workflow_ships_a_release_that_can_be_published():
    """Issue 41, 7: the multi-GB job ran on every pull request, pinned neither torch nor
    xllamacpp, never checked that the CUDA xllamacpp imports (or fails only for want of
    the driver on a GPU-less runner), published nothing, and its tests ran with
    PYTHONUTF8=1, which the frozen app never has."""
    text = WORKFLOW.read_text()
    workflow = yaml.safe_load(text)
    header = text.split("\nname:", 1)[0]
    for variable in ("TORCH_CUDA_INDEX_URL", "XLLAMACPP_CUDA_INDEX_URL"):
        assert variable in header, variable
        assert variable in (ROOT / "packaging" / "README.md").read_text(), variable
    jobs = workflow["jobs"]
    assert "PYTHONUTF8" not in json.dumps(jobs["tests"])
    heavy = jobs["bundle"]["if"]
    assert "workflow_dispatch" in heavy and "refs/tags/" in heavy and "pull_request" not in heavy
    pins = workflow["env"]
    assert pins["TORCH_VERSION"].count(".") == 2 and pins["XLLAMACPP_VERSION"]
    runs = [step.get("run", "") for step in jobs["bundle"]["steps"]]
    torch_step = next(r for r in runs if "--index-url $env:TORCH_INDEX" in r)
    assert "torch==$env:TORCH_VERSION" in torch_step
    wheel = next(i for i, r in enumerate(runs) if "$env:XLLAMACPP_INDEX" in r)
    assert "xllamacpp==$env:XLLAMACPP_VERSION" in runs[wheel]
    imports = next(r for r in runs[wheel + 1 :] if "import xllamacpp" in r)
    assert "DLL load failed while importing xllamacpp" in imports  # the driver, and only it
    smoke = next(r for r in runs if "packaging/smoke_test.py" in r)
    # issue 55: the bundle carries llama.cpp's CPU build, so a GPU-less runner streams the
    # GGUF chat through it (it took --gguf-refused before)
    assert "--gguf-refused" not in smoke
    cpu_build = next(i for i, r in enumerate(runs) if "--target build/llama-cpu" in r)
    assert cpu_build < wheel and "xllamacpp==$env:XLLAMACPP_VERSION" in runs[cpu_build]
    assets = next(r for r in runs if "packaging/release_assets.py" in r)
    assert "dist/vramgate" in assets
    installer = next(r for r in runs if "packaging/build_installer.py" in r)
    assert "dist/vramgate" in installer and "SHA256SUMS.txt" in installer
    release = jobs["release"]
    assert release["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert release["permissions"] == {"contents": "write"}
    assert {"tests", "bundle"} <= set(release["needs"])  # never a release whose tests failed
    # the CPU flavour's installer (every PC's) beside the CUDA zips, in the release
    assert "bundle-cpu" in release["needs"]
    cpu_runs = " ".join(step.get("run", "") for step in jobs["bundle-cpu"]["steps"])
    assert "build_installer.py dist/vramgate assets --flavour cpu" in cpu_runs
    assert "smoke_test.py dist/vramgate --gguf" in cpu_runs
    published = " ".join(step.get("run", "") for step in release["steps"])
    assert "gh release create" in published and "SHA256SUMS.txt" in published
    assert "packaging/release_notes.py assets --cuda" in published
