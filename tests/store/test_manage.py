"""Model management (app.store.manage): `vramgate pull` into a running server, `list`, `ps`,
`rm`, and the reread route they use. Real processes for the commands, a real server,
real (small, random) models saved with the real save code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.config.settings import ConfigSource, ModelSpec, SimulatedBucket, load_settings
from app.store.pull import PullError, remove_from_config
from tests.support.live import clean_env, live_server, make_settings, wait_until
from tests.support.random_models import save_random_bert

VRAMGATE = [sys.executable, "-m", "app"]
MiB = 2**20
SIM = (SimulatedBucket(size=16, bytes=10 * MiB, run_ms=1),)


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("src") / "tiny-embed"
    return save_random_bert(folder, hidden=32, layers=1, heads=2, max_seq=64)


def vramgate(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*VRAMGATE, *args],
        env=clean_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def served(tmp_path):
    """A server started from a config file it can reread (as `vramgate serve --config`)."""
    config = tmp_path / "config.toml"
    config.write_text(
        '[[models]]\nname = "sim"\nkind = "simulated"\nweights = "100MiB"\n'
        "[[models.buckets]]\nsize = 16\nbytes = 10485760\nrun_ms = 1\n"
    )
    settings = make_settings(tmp_path, device="cpu", models_dir=tmp_path / "models")
    source = ConfigSource(config, {"device": "cpu", "models_dir": tmp_path / "models"})
    models = source.settings().models
    with live_server(settings.model_copy(update={"models": models}), models_source=source) as live:
        yield live, config, ["--config", str(config), "--models-dir", str(tmp_path / "models")]


def names(live) -> list[str]:
    return [m["id"] for m in httpx.get(live.url + "/v1/models", timeout=30).json()["data"]]


def test_a_model_pulled_while_the_server_runs_is_served_without_a_restart(served, bert):
    live, _, where = served
    assert names(live) == ["sim"]
    done = vramgate("pull", str(bert), *where, "--url", live.url)
    assert done.returncode == 0, done.stderr
    assert "rereads its models: added: tiny-embed" in done.stdout
    assert names(live) == ["sim", "tiny-embed"]
    body = {"model": "tiny-embed", "input": ["a cat", "a dog"]}
    answer = httpx.post(live.url + "/v1/embeddings", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["data"]) == 2


def test_list_ps_and_rm(served, bert, tmp_path):
    live, config, where = served
    assert vramgate("pull", str(bert), *where, "--url", live.url).returncode == 0
    (tmp_path / "models" / "stray").mkdir()
    (tmp_path / "models" / "stray" / "config.json").write_text("{}")

    listing = vramgate("list", *where, "--url", live.url)
    assert listing.returncode == 0, listing.stderr
    cells = [re.split(r"\s{2,}", line) for line in listing.stdout.splitlines()]
    assert cells[0] == ["NAME", "KIND", "SIZE", "STATE", "PATH"]
    rows = {row[0]: row[1:] for row in cells[1:]}
    assert rows["sim"] == ["simulated", "-", "ready", "-"]
    kind, size, state, path = rows["tiny-embed"]
    assert (kind, state, path) == ("embedding", "unloaded", str(tmp_path / "models/tiny-embed"))
    assert float(size.removesuffix(" MiB")) > 0  # its size on disk
    assert rows["stray"][2] == "not in config"

    httpx.post(live.url + "/v1/embeddings", json={"model": "tiny-embed", "input": "x"}, timeout=120)
    ps = vramgate("ps", *where, "--url", live.url)
    assert ps.returncode == 0, ps.stderr
    resident = {line.split()[0]: line for line in ps.stdout.splitlines()[1:]}
    assert set(resident) == {"sim", "tiny-embed"}
    assert resident["sim"].endswith("forever")  # tests keep models for good (keep_alive -1)
    assert "100% CPU" in resident["tiny-embed"]  # where it runs, as Ollama's ps says it

    refused = vramgate("rm", "tiny-embed", *where, "--url", live.url, "--yes")
    assert refused.returncode == 1 and "--force" in refused.stderr
    kept = vramgate("rm", "tiny-embed", *where, "--url", live.url, "--force", stdin="n\n")
    assert kept.returncode == 1 and "nothing removed" in kept.stdout
    assert (tmp_path / "models" / "tiny-embed").is_dir()

    removed = vramgate("rm", "tiny-embed", *where, "--url", live.url, "--force", stdin="y\n")
    assert removed.returncode == 0, removed.stderr
    assert not (tmp_path / "models" / "tiny-embed").exists()
    assert [m.name for m in load_settings({}, config).models] == ["sim"]
    assert names(live) == ["sim"]
    gone = httpx.post(live.url + "/v1/embeddings", json={"model": "tiny-embed", "input": "x"})
    assert gone.status_code == 404
    wait_until(lambda: "tiny-embed" not in live.service.registry.entries, 10, "forgotten")


def test_a_model_taken_out_of_the_config_finishes_its_work_then_goes(tmp_path):
    slow = ModelSpec(
        name="slow",
        kind="simulated",
        weights=100 * MiB,
        buckets=(SimulatedBucket(size=16, bytes=10 * MiB, run_ms=600),),
    )
    other = ModelSpec(name="other", kind="simulated", buckets=SIM)
    settings = make_settings(tmp_path, device="simulated:2GiB", models=(other, slow))
    config = tmp_path / "config.toml"
    config.write_text('[[models]]\nname = "other"\nkind = "simulated"\n')
    with live_server(settings, models_source=ConfigSource(config)) as live:
        httpx.post(live.url + "/admin/models/slow/load", timeout=30)
        with httpx.Client(base_url=live.url, timeout=30) as client:
            import threading

            answers: list[int] = []
            running = threading.Thread(
                target=lambda: answers.append(
                    client.post("/v1/embeddings", json={"model": "slow", "input": "w"}).status_code
                )
            )
            running.start()
            wait_until(lambda: live.service.scheduler.gate.running == 1, 10, "slow runs")
            changes = client.post("/admin/models/reread").json()
            assert changes["removed"] == ["slow"] and changes["models"] == ["other"]
            assert (
                client.post("/v1/embeddings", json={"model": "slow", "input": "w"}).status_code
                == 404
            )
            running.join(30)
        assert answers == [200]  # the request that ran finished
        wait_until(lambda: "slow" not in live.service.registry.entries, 10, "slow gone")
        assert live.service.device.allocated() == 0  # its weights went with it


def test_the_reread_route_refuses_where_there_is_no_config_to_read(server_factory):
    live = server_factory(device="simulated:1GiB", models=(ModelSpec(name="s", kind="simulated"),))
    refused = httpx.post(live.url + "/admin/models/reread", timeout=30)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "conflict"


def test_a_models_table_leaves_the_config_with_its_sub_tables_and_nothing_else(tmp_path):
    config = tmp_path / "config.toml"
    text = (
        "# my settings\nport = 8451\n\n"
        '[[models]]\nname = "keep"\nkind = "simulated"\n\n'
        '[[models]]\nname = "drop"\nkind = "simulated"\n[models.inject]\noom_on_calls = [3]\n'
        "[[models.buckets]]\nsize = 16\nbytes = 1048576\nrun_ms = 1\n\n"
        '# the last one\n[[models]]\nname = "last"  # a comment\nkind = "simulated"\n'
    )
    config.write_text(text)
    current = load_settings({}, config).models
    remove_from_config(config, "drop", current)
    after = config.read_text()
    assert [m.name for m in load_settings({}, config).models] == ["keep", "last"]
    assert "# my settings\nport = 8451" in after and "# the last one" in after
    assert "drop" not in after and "oom_on_calls" not in after
    with pytest.raises(PullError, match="absent is not a"):
        remove_from_config(config, "absent", load_settings({}, config).models)
    config.write_text("port = 8451\n")
    with pytest.raises(PullError, match="served by default"):
        remove_from_config(config, "all-MiniLM-L6-v2", load_settings({}, config).models)
    assert config.read_text() == "port = 8451\n"


def rm_here(tmp_path: Path, name: str) -> int:
    """`vramgate rm NAME --yes` in this process, with no server answering."""
    import argparse

    from app.store.manage import rm_command

    where = {"config": tmp_path / "config.toml", "models_dir": tmp_path / "models"}
    args = argparse.Namespace(**where, url="http://127.0.0.1:9", name=name, force=False, yes=True)
    return rm_command(args)


@pytest.fixture
def pulled(tmp_path, bert) -> Path:
    from app.store.pull import pull

    settings = make_settings(tmp_path, models_dir=tmp_path / "models")
    return pull(str(bert), settings, tmp_path / "config.toml").path


def held_open(monkeypatch, folder: Path, name: str) -> None:
    """Windows' hold on a file another program has open or mapped: the file cannot be
    deleted (os.unlink raises PermissionError, as WinError 32 does) and the folder holding
    it cannot be renamed."""
    import os

    real_unlink, real_replace, real_rename = os.unlink, os.replace, os.rename

    def unlink(path, *args, **kwargs):
        if Path(path).name == name:
            raise PermissionError(13, "used by another process", str(path))
        return real_unlink(path, *args, **kwargs)

    def move(real):
        def moved(src, dst, *args, **kwargs):
            if Path(src) == folder:
                raise PermissionError(5, "Access is denied", str(src))
            return real(src, dst, *args, **kwargs)

        return moved

    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "replace", move(real_replace))
    monkeypatch.setattr(os, "rename", move(real_rename))


def test_rm_of_a_model_whose_files_are_held_changes_nothing_and_says_why(
    tmp_path, pulled, monkeypatch, capsys
):
    """Before, the config entry went first and the folder was deleted with errors
    ignored: the files stayed, the model was gone from the config, and rm said
    'removed'."""
    held_open(monkeypatch, pulled, "model.safetensors")
    assert rm_here(tmp_path, "tiny-embed") == 1
    assert "holds a file in it" in capsys.readouterr().err
    assert [m.name for m in load_settings({}, tmp_path / "config.toml").models][-1] == "tiny-embed"
    assert (pulled / "model.safetensors").is_file() and (pulled / "config.json").is_file()


def test_rm_says_what_it_could_not_delete(tmp_path, pulled, monkeypatch, capsys):
    """A file that cannot be deleted once the folder is set aside: the model is out of
    the config and its name is free, and rm says which folder is left to delete."""
    import os

    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if Path(path).name == "model.safetensors":
            raise PermissionError(13, "used by another process", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    assert rm_here(tmp_path, "tiny-embed") == 0
    said = capsys.readouterr()
    assert "could not delete" in said.err and "pull-" in said.err, said
    assert not pulled.exists()
    assert "tiny-embed" not in [m.name for m in load_settings({}, tmp_path / "config.toml").models]
