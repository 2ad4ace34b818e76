"""`vramgate pull hf:ORG/NAME[:QUANT]` against a Hub of our own on loopback (HF_ENDPOINT):
one GGUF quantisation fetched of a repo holding several (the bytes the hub sent counted
per file), a split one whole, the projector kept, a killed pull resumed, a missing
quantisation listed, a download that would not fit refused before its first byte."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config.settings import load_settings
from app.store.hub import check_free_disk, choose, model_name, projector, quant_of, quants_of
from app.store.progress import EventProgress
from app.store.pull import pull
from app.store.sources import PullError, Source, parse_source
from tests.support.hub import Hub
from tests.support.live import clean_env, live_server, make_settings, wait_until
from tests.support.random_models import save_random_llama, save_random_llama_gguf

VRAMGATE = [sys.executable, "-m", "app"]
REPO = "Org/Tiny-Chat-GGUF"
SPLIT = ("Tiny-Chat-Q6_K/Tiny-Chat-Q6_K-00001-of-00002.gguf",
         "Tiny-Chat-Q6_K/Tiny-Chat-Q6_K-00002-of-00002.gguf")  # fmt: skip


def small_gguf(path: Path, nbytes: int) -> bytes:
    """A GGUF of one float32 tensor of about `nbytes` (gguf's own writer), its bytes."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_tensor("token_embd.weight", np.full(nbytes // 4, len(path.name), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, bytes]:
    """A GGUF repo as people publish them: three whole quantisations (Q4_K_M a real
    random Llama llama.cpp loads), a fourth split in two in a folder of its own (the
    same Llama), two projectors, a README."""
    root = tmp_path_factory.mktemp("repo")
    llama = save_random_llama(root / "Tiny-Chat", context=256)
    whole = save_random_llama_gguf(llama, root / "Tiny-Chat-Q4_K_M.gguf")
    first = save_random_llama_gguf(llama, root / "Tiny-Chat-Q6_K.gguf", split_max_tensors=12)
    assert first.name == Path(SPLIT[0]).name
    return {
        "README.md": b"# Tiny-Chat GGUF\n",
        "Tiny-Chat-IQ3_M.gguf": small_gguf(root / "Tiny-Chat-IQ3_M.gguf", 40_000),
        "Tiny-Chat-Q4_K_M.gguf": whole.read_bytes(),
        "Tiny-Chat-Q8_0.gguf": small_gguf(root / "Tiny-Chat-Q8_0.gguf", 200_000),
        SPLIT[0]: first.read_bytes(),
        SPLIT[1]: first.with_name(Path(SPLIT[1]).name).read_bytes(),
        "mmproj-Tiny-Chat-f16.gguf": small_gguf(root / "mmproj-Tiny-Chat-f16.gguf", 30_000),
        "mmproj-Tiny-Chat-Q8_0.gguf": small_gguf(root / "mmproj-Tiny-Chat-Q8_0.gguf", 16_000),
    }


@pytest.fixture(scope="module")
def hub(files):
    with Hub() as hub:
        hub.add(REPO, files)
        yield hub


@pytest.fixture
def fresh(hub):
    hub.reset()
    return hub


def pull_command(hub: Hub, source: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    command = [*VRAMGATE, "pull", source, "--config", str(tmp_path / "config.toml"),
               "--models-dir", str(tmp_path / "models")]  # fmt: skip
    env = clean_env() | {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    return command, env


def run_pull(hub: Hub, source: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    command, env = pull_command(hub, source, tmp_path)
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_a_default_pull_fetches_only_q4_k_m_and_the_f16_projector(fresh, files, tmp_path):
    """Before: every GGUF of the repo was fetched and the first (IQ3_M) served."""
    done = run_pull(fresh, f"hf:{REPO}", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert dict(fresh.sent) == {
        f"{REPO}/Tiny-Chat-Q4_K_M.gguf": len(files["Tiny-Chat-Q4_K_M.gguf"]),
        f"{REPO}/mmproj-Tiny-Chat-f16.gguf": len(files["mmproj-Tiny-Chat-f16.gguf"]),
    }
    assert "fetching Q4_K_M: the default" in done.stdout
    assert "B/s" in done.stderr  # the bar: bytes, speed, time left
    folder = tmp_path / "models" / "Tiny-Chat-Q4_K_M"
    assert sorted(p.name for p in folder.iterdir()) == [
        "Tiny-Chat-Q4_K_M.gguf",
        "mmproj-Tiny-Chat-f16.gguf",
    ]
    assert (folder / "Tiny-Chat-Q4_K_M.gguf").read_bytes() == files["Tiny-Chat-Q4_K_M.gguf"]
    entry = load_settings({}, tmp_path / "config.toml").models[-1]
    assert (entry.name, entry.kind) == ("Tiny-Chat-Q4_K_M", "generation")
    assert entry.path == folder / "Tiny-Chat-Q4_K_M.gguf"
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["Tiny-Chat-Q4_K_M"]


@pytest.mark.slow
def test_a_named_split_quant_comes_whole_and_llama_cpp_serves_it(fresh, files, tmp_path):
    """Ollama's spelling, any case: both shards of the split Q6_K, side by side under
    their own names, loaded by llama.cpp's engine from the first and chatted with, by
    its name and, through the `ollama` client, by the name it was pulled with."""
    from ollama import Client, ResponseError
    from openai import OpenAI

    done = run_pull(fresh, f"hf.co/{REPO}:q6_k", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(fresh.sent) == {f"{REPO}/{SPLIT[0]}", f"{REPO}/{SPLIT[1]}",
                               f"{REPO}/mmproj-Tiny-Chat-f16.gguf"}  # fmt: skip
    folder = tmp_path / "models" / "Tiny-Chat-Q6_K"
    for shard in SPLIT:
        assert (folder / Path(shard).name).read_bytes() == files[shard]
    entry = load_settings({}, tmp_path / "config.toml").models[-1]
    assert entry.name == "Tiny-Chat-Q6_K" and entry.path == folder / Path(SPLIT[0]).name
    assert entry.pulled_from == f"hf:{REPO}:Q6_K"  # the quantisation fetched
    serving = make_settings(tmp_path / "serve", device="cpu", models=(entry,), cpu_threads=1)
    with live_server(serving) as live:
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(
            model="Tiny-Chat-Q6_K", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        status = httpx.get(live.url + "/status", timeout=10).json()
        listed = {m.id: m.aliases for m in client.models.list()}  # type: ignore[attr-defined]
        # as `ollama run hf.co/ORG/NAME:QUANT` goes on after its pull: show, then chat,
        # by the name it pulled with
        ollama = Client(host=live.url)
        pulled_as = f"hf.co/{REPO}:q6_k"
        assert ollama.show(pulled_as).modelinfo["vramgate.engine"] == "llama.cpp"
        chat = ollama.chat(model=pulled_as, messages=[{"role": "user", "content": "hi"}],
                           options={"num_predict": 4})  # fmt: skip
        assert chat.eval_count and chat.eval_count >= 1
        with pytest.raises(ResponseError) as other:  # a quantisation it did not pull
            ollama.chat(model=f"hf.co/{REPO}:Q8_0", messages=[{"role": "user", "content": "hi"}])
    assert other.value.status_code == 404
    assert answer.usage.completion_tokens >= 1
    assert [m["engine"] for m in status["models"] if m["name"] == "Tiny-Chat-Q6_K"] == ["llama.cpp"]
    assert listed == {"Tiny-Chat-Q6_K": [f"hf.co/{REPO}:Q6_K"]}


@pytest.mark.slow
def test_a_killed_pull_resumes_with_a_range_for_the_rest(fresh, files, tmp_path):
    """The hub stalls the file after 100 kB; the pull is killed there. The next pull asks
    for the rest (a Range from byte 100000) and the file is whole: each byte sent once."""
    name = "Tiny-Chat-Q4_K_M.gguf"
    fresh.stall[f"{REPO}/{name}"] = 100_000
    command, env = pull_command(fresh, f"hf:{REPO}:Q4_K_M", tmp_path)
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while fresh.sent[f"{REPO}/{name}"] < 100_000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fresh.sent[f"{REPO}/{name}"] == 100_000, "the pull never reached the stall"
        partial = next((tmp_path / "models").rglob(name))
        deadline = time.monotonic() + 30
        while partial.stat().st_size < 100_000 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        child.kill()
        child.wait()
    assert partial.stat().st_size == 100_000
    del fresh.stall[f"{REPO}/{name}"]
    done = run_pull(fresh, f"hf:{REPO}:Q4_K_M", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (f"{REPO}/{name}", "bytes=100000-") in fresh.ranges
    assert fresh.sent[f"{REPO}/{name}"] == len(files[name])  # 100000 then the rest
    assert "resuming: 100000 of" in done.stdout
    kept = tmp_path / "models" / "Tiny-Chat-Q4_K_M" / name
    assert kept.read_bytes() == files[name]
    assert not (tmp_path / "models" / "pull-partial").exists()  # the killed pull's scratch
    # folder (empty, `pull-...`) stays: no model, and `vramgate list` skips it


def test_a_missing_quant_is_refused_with_the_repos_quants(fresh, tmp_path):
    done = run_pull(fresh, f"hf:{REPO}:Q5_K_S", tmp_path)
    assert done.returncode == 1
    assert f"{REPO} has no quantisation Q5_K_S; it has IQ3_M, Q8_0, Q4_K_M, Q6_K" in done.stderr
    assert not fresh.sent and not (tmp_path / "config.toml").exists()


def test_a_download_that_would_not_fit_is_refused_before_a_byte(
    fresh, files, tmp_path, monkeypatch
):
    """Free disk (the one reading of it patched: this disk has room) one byte short of
    the Q4_K_M and its projector: refused, saying both numbers; nothing fetched or left.
    The endpoint is set as HF_ENDPOINT sets it (read once when huggingface_hub loads)."""
    from huggingface_hub import constants

    import app.store.hub

    monkeypatch.setattr(constants, "ENDPOINT", fresh.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    needed = len(files["Tiny-Chat-Q4_K_M.gguf"]) + len(files["mmproj-Tiny-Chat-f16.gguf"])
    monkeypatch.setattr(app.store.hub, "free_bytes", lambda folder: needed - 1)
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    with pytest.raises(PullError, match="not enough free disk") as refused:
        pull(f"hf:{REPO}", settings, tmp_path / "config.toml")
    assert f"needs {needed} bytes" in str(refused.value)
    assert f"{needed - 1} bytes" in str(refused.value)
    assert not fresh.sent
    assert list((tmp_path / "models").iterdir()) == []
    monkeypatch.setattr(app.store.hub, "free_bytes", lambda folder: needed)  # the twin: fits
    spec = pull(f"hf:{REPO}", settings, tmp_path / "config.toml")
    assert spec.name == "Tiny-Chat-Q4_K_M" and sum(fresh.sent.values()) == needed
    with pytest.raises(PullError, match="Tiny-Chat-Q4_K_M exists; pass --force"):
        pull(f"hf:{REPO}", settings, tmp_path / "config.toml")  # taken: refused before
    assert sum(fresh.sent.values()) == needed  # its download, not after


def test_ollamas_client_pulls_one_quant_with_byte_progress_and_speed(
    fresh, files, tmp_path, monkeypatch
):
    """`ollama pull hf.co/ORG/NAME:QUANT` as Ollama's own client sends it, to a running
    server: its progress events count the bytes (and carry the speed and time left), the
    model is served under its new name. The endpoint is set as HF_ENDPOINT sets it."""
    import json

    from huggingface_hub import constants
    from ollama import Client

    from app.config.settings import ConfigSource

    monkeypatch.setattr(constants, "ENDPOINT", fresh.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    config = tmp_path / "config.toml"
    config.write_text('[[models]]\nname = "sim"\nkind = "simulated"\n')
    source = ConfigSource(config, {"device": "cpu", "models_dir": tmp_path / "models"})
    settings = make_settings(tmp_path, device="cpu", models=source.settings().models)
    with live_server(settings, models_source=source) as live:
        client = Client(host=live.url)
        events = list(client.pull(f"hf.co/{REPO}:iq3_m", stream=True))
        assert events[-1].status == "success"
        counted = [e for e in events if e.total]
        assert (
            counted[-1].completed
            == counted[-1].total
            == len(files["Tiny-Chat-IQ3_M.gguf"]) + len(files["mmproj-Tiny-Chat-f16.gguf"])
        )
        assert "Tiny-Chat-IQ3_M" in [m.model for m in client.list().models]
        with httpx.stream(
            "POST", live.url + "/api/pull", json={"model": f"hf:{REPO}:Q8_0"}, timeout=60
        ) as answer:
            raw = [json.loads(line) for line in answer.iter_lines() if line]
    assert raw[-1]["status"] == "success", raw[-1]
    assert any(e.get("bytes_per_second", 0) > 0 and "seconds_left" in e for e in raw), raw
    assert set(fresh.sent) == {
        f"{REPO}/Tiny-Chat-IQ3_M.gguf",
        f"{REPO}/Tiny-Chat-Q8_0.gguf",
        f"{REPO}/mmproj-Tiny-Chat-f16.gguf",
    }


@pytest.mark.slow
def test_a_safetensors_repo_comes_as_a_snapshot_as_before(hub, tmp_path_factory, tmp_path):
    """A repo without GGUF files: its model files (no pickles) fetched through
    huggingface_hub's snapshot, as before; named after the repo (before: `hub`, the
    scratch folder it came into)."""
    llama = save_random_llama(tmp_path_factory.mktemp("st") / "tiny-chat", context=256)
    files = {p.name: p.read_bytes() for p in llama.iterdir() if p.is_file()}
    hub.add("Org/tiny-chat", files | {"pytorch_model.bin": b"a pickle: never fetched"})
    hub.reset()
    done = run_pull(hub, "hf:Org/tiny-chat", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Org/tiny-chat/pytorch_model.bin" not in hub.sent
    assert hub.sent["Org/tiny-chat/model.safetensors"] == len(files["model.safetensors"])
    entry = load_settings({}, tmp_path / "config.toml").models[-1]
    assert (entry.name, entry.kind) == ("tiny-chat", "generation")
    assert (entry.path / "model.safetensors").read_bytes() == files["model.safetensors"]


@pytest.mark.parametrize("path", ["../evil-Q4_K_M.gguf", "a/../../evil.gguf", "/tmp/evil.gguf"])
def test_a_repo_file_path_leaving_the_download_folder_is_refused(tmp_path, path):
    """The hub's listing names the files: one that would land outside the folder they
    gather in is refused before a request is made or a folder written."""
    from app.store.hub import download_files
    from app.store.progress import Progress

    with pytest.raises(PullError, match="names a file outside itself"):
        download_files("o/m", "0" * 40, {path: 1}, tmp_path / "partial", tmp_path, Progress())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("needed", "free", "refused"),
    [(10, 10, False), (11, 10, True), (0, 0, False), (5 * 2**30, 2**30, True)],
)
def test_the_free_disk_check(tmp_path, needed, free, refused):
    if refused:
        with pytest.raises(PullError, match=f"needs {needed} bytes .* {free} bytes"):
            check_free_disk(needed, free, tmp_path)
    else:
        check_free_disk(needed, free, tmp_path)


@pytest.mark.parametrize(
    ("path", "quant"),
    [
        ("Llama-3.2-3B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("llama-3.2-3b-instruct-iq3_m.gguf", "IQ3_M"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("Q8_0/Qwen3-32B-Q8_0-00002-of-00003.gguf", "Q8_0"),
        ("Qwen3-8B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("gemma-3-4b-it-f16.gguf", "F16"),
        ("Model-BF16.gguf", "BF16"),
        ("model.gguf", "model"),
        ("Qwen2.5-7B-Instruct-Q4_K_M-imat.gguf", "Q4_K_M"),
        ("mistral-7b-instruct-v0.2.Q5_K_S.gguf", "Q5_K_S"),
    ],
)
def test_the_quantisation_a_file_name_says(path, quant):
    assert quant_of(path) == quant


def test_without_q4_k_m_the_nearest_in_bits_per_weight_is_chosen_and_said():
    sizes = {"m-IQ3_M.gguf": 3, "m-Q5_K_M.gguf": 5, "m-Q8_0.gguf": 8, "mmproj-m-f16.gguf": 1}
    quant, why = choose(quants_of(sizes), None, "o/m")
    assert quant.label == "Q5_K_M"
    assert "no Q4_K_M; Q5_K_M is the nearest to it in bits per weight (5.7 against 4.89" in why
    assert choose(quants_of(sizes), "iq3_m", "o/m")[0].files == ("m-IQ3_M.gguf",)
    with pytest.raises(PullError, match="has no quantisation Q2_K; it has IQ3_M, Q5_K_M, Q8_0"):
        choose(quants_of(sizes), "Q2_K", "o/m")


def test_files_that_say_one_quantisation_are_told_apart_and_shards_are_one():
    sizes = {"m-Q4_K_M.gguf": 4, "m-Q4_K_M-imat.gguf": 4, "m-Q6_K-00001-of-00002.gguf": 3,
             "m-Q6_K-00002-of-00002.gguf": 3, "other.gguf": 1, "more.gguf": 2}  # fmt: skip
    quants = quants_of(sizes)
    assert sorted(quants) == ["M-Q4_K_M", "M-Q4_K_M-IMAT", "MORE", "OTHER", "Q6_K"]
    assert quants["Q6_K"].files == ("m-Q6_K-00001-of-00002.gguf", "m-Q6_K-00002-of-00002.gguf")
    assert quants["Q6_K"].size == 6
    assert choose(quants, None, "o/m")[0].label == "M-Q4_K_M"  # says Q4_K_M, of the two
    quant, why = choose(quants_of({"a.gguf": 5, "b.gguf": 2}), None, "o/m")
    assert quant.files == ("b.gguf",) and "the smallest" in why


def test_the_f16_projector_is_kept_of_several():
    sizes = {"mmproj-BF16.gguf": 2, "mmproj-F16.gguf": 3, "mmproj-Q8_0.gguf": 1, "m.gguf": 9}
    assert projector(sizes) == "mmproj-F16.gguf"
    assert projector({"mmproj-Q8_0.gguf": 1, "mmproj-Q4_0.gguf": 2}) == "mmproj-Q8_0.gguf"
    assert projector({"m.gguf": 9}) is None


def test_the_model_is_named_after_the_repo_and_quant():
    assert model_name("bartowski/Llama-3.2-3B-Instruct-GGUF", "Q4_K_M") == (
        "Llama-3.2-3B-Instruct-Q4_K_M"
    )
    assert model_name("Qwen/Qwen3-8B-GGUF", "Q8_0") == "Qwen3-8B-Q8_0"
    assert model_name("org/Model-Q4_K_M-GGUF", "Q4_K_M") == "Model-Q4_K_M"
    assert model_name("org/plain", None) == "plain"


def test_hub_sources_in_each_spelling():
    want = Source("hub", "bartowski/Llama-3.2-3B-Instruct-GGUF", "Q4_K_M")
    for text in [
        "hf:bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M",
        "hf.co/bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M",
        "huggingface.co/bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M",
    ]:
        assert parse_source(text) == want
    assert parse_source("hf.co/org/repo:latest") == Source("hub", "org/repo")
    assert parse_source("hf:org/repo") == Source("hub", "org/repo")
    with pytest.raises(PullError, match=r"hf:ORG/NAME\[:QUANT\]"):
        parse_source("hf.co/just-a-name")


def test_progress_events_carry_the_speed_and_time_left():
    """Bytes per second of the bytes that came since `begin` (a resumed download's first
    bytes are not counted), and the time the rest takes at that speed (the clock given)."""
    now = [100.0]
    events: list[dict] = []
    progress = EventProgress(events.append, clock=lambda: now[0])
    progress.begin("downloading o/m", total=1000, done=200)
    assert events[-1] == {"status": "downloading o/m", "total": 1000, "completed": 200}
    now[0] += 2.0
    progress.advance(400)
    assert events[-1] == {"status": "downloading o/m", "total": 1000, "completed": 600,
                          "bytes_per_second": 200, "seconds_left": 2.0}  # fmt: skip


def test_two_pulls_of_one_repo_at_once_both_end_with_a_whole_model(
    fresh, files, tmp_path, monkeypatch
):
    """`vramgate pull` in a terminal, paused by the hub 100 kB into its Q4_K_M, and a
    running server's pull of the same repo's IQ3_M (Ollama's client): the server's waits,
    saying whose pull it waits for, and goes on when that one has ended; both models are
    whole, each byte sent once, and nothing is left in `pull-partial`. Before: the two
    shared the repo's partial folder, and the first to end deleted it under the other."""
    from huggingface_hub import constants
    from ollama import Client

    from app.config.settings import ConfigSource

    monkeypatch.setattr(constants, "ENDPOINT", fresh.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    first_file, second_file = "Tiny-Chat-Q4_K_M.gguf", "Tiny-Chat-IQ3_M.gguf"
    go_on = threading.Event()
    fresh.paused[f"{REPO}/{first_file}"] = (100_000, go_on)
    config = tmp_path / "config.toml"
    config.write_text('[[models]]\nname = "sim"\nkind = "simulated"\n')
    command, env = pull_command(fresh, f"hf:{REPO}:Q4_K_M", tmp_path)
    first = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    events: list[Any] = []
    try:
        wait_until(lambda: fresh.sent[f"{REPO}/{first_file}"] == 100_000, 120, "the pause")
        source = ConfigSource(config, {"device": "cpu", "models_dir": tmp_path / "models"})
        settings = make_settings(tmp_path / "s", device="cpu", models=source.settings().models)
        with live_server(settings, models_source=source) as live:

            def second_pull() -> None:
                events.extend(Client(host=live.url).pull(f"hf.co/{REPO}:iq3_m", stream=True))

            second = threading.Thread(target=second_pull)
            second.start()
            waits = lambda: any("another pull" in (e.status or "") for e in events)  # noqa: E731
            wait_until(lambda: waits() or not second.is_alive(), 120, "the second pull's wait")
            go_on.set()
            told, _ = first.communicate(timeout=300)
            second.join(300)
            assert not second.is_alive()
    finally:
        go_on.set()
        first.kill()
        first.wait()
    assert first.returncode == 0, told[-3000:]
    statuses = [e.status for e in events]
    assert statuses[-1] == "success", statuses
    (waited,) = [s for s in statuses if "another pull" in (s or "")]
    assert f"another pull of {REPO} is under way, by process {first.pid} (" in waited
    assert f"the other pull of {REPO} has ended; this one goes on" in statuses
    for name, file in (("Tiny-Chat-Q4_K_M", first_file), ("Tiny-Chat-IQ3_M", second_file)):
        assert (tmp_path / "models" / name / file).read_bytes() == files[file]
        assert fresh.sent[f"{REPO}/{file}"] == len(files[file])  # each byte once
    projector = "mmproj-Tiny-Chat-f16.gguf"
    assert fresh.sent[f"{REPO}/{projector}"] == 2 * len(files[projector])  # one per model
    names = [m.name for m in load_settings({}, config).models]
    assert names == ["sim", "Tiny-Chat-Q4_K_M", "Tiny-Chat-IQ3_M"]
    assert not (tmp_path / "models" / "pull-partial").exists()


def test_a_file_that_comes_longer_than_listed_stops_at_its_listed_size(
    fresh, files, tmp_path, monkeypatch
):
    """The hub sends 50 kB more of the Q4_K_M than its listing says (the free disk was
    checked for the listed bytes): the pull stops there and says so, keeping none of it;
    the next pull, of a hub that sends what it lists, fetches it whole. Before: all of it
    was written, and refused only after."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", fresh.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    name = "Tiny-Chat-Q4_K_M.gguf"
    size = len(files[name])
    fresh.oversend[f"{REPO}/{name}"] = 50_000
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    with pytest.raises(PullError) as refused:
        pull(f"hf:{REPO}:Q4_K_M", settings, tmp_path / "config.toml")
    assert f"{name} came with more than the {size} bytes the hub lists for it" in str(refused.value)
    (partial,) = (tmp_path / "models" / "pull-partial").rglob(name)
    assert partial.stat().st_size == 0
    assert not (tmp_path / "config.toml").exists()
    fresh.reset()  # the twin: the hub sends what it lists
    spec = pull(f"hf:{REPO}:Q4_K_M", settings, tmp_path / "config.toml")
    assert spec.path is not None and spec.path.read_bytes() == files[name]
    assert not (tmp_path / "models" / "pull-partial").exists()
