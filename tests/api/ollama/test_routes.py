"""Ollama's API (app.api.ollama.routes) through the official `ollama` Python client,
unchanged, pointed at a live vramgate: a small random Llama ("tiny", its free text is
noise) and the embedded all-MiniLM-L6-v2, read from a config file the server can pull
into. Answers are checked against the OpenAI routes' for the same request."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import Awaitable, Iterator

import httpx
import jsonschema
import pytest
from ollama import AsyncClient, Client, ResponseError
from openai import OpenAI

from app.config.settings import ConfigSource, ModelSpec
from tests.support.live import Live, ServerProcess, free_port, live_server, make_settings
from tests.support.random_models import save_model_wheel, save_random_bert, save_random_llama

MINILM = "all-MiniLM-L6-v2"
ASK = [{"role": "user", "content": "Tell me about cats."}]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[Live, Client, OpenAI]]:
    root = tmp_path_factory.mktemp("ollama")
    tiny = save_random_llama(root / "tiny", context=1024)
    config = root / "config.toml"
    config.write_text(
        f'[[models]]\nname = "{MINILM}"\nkind = "embedding"\n\n'
        f'[[models]]\nname = "tiny"\nkind = "generation"\npath = {json.dumps(str(tiny))}\n'
    )
    source = ConfigSource(config, {"device": "cpu", "models_dir": root / "models"})
    settings = make_settings(root, device="cpu", models=source.settings().models)
    with live_server(settings, models_source=source) as live:
        yield live, Client(host=live.url), OpenAI(base_url=live.url + "/v1", api_key="x")


def test_version_tags_show_and_ps(served):
    live, client, _ = served
    assert httpx.get(live.url + "/api/version").json()["version"]
    names = [m.model for m in client.list().models]
    assert names == ["tiny", MINILM]  # what chats first (Open WebUI picks the first)
    assert all(m.size and m.size > 0 and m.digest for m in client.list().models)
    shown = client.show("tiny")
    assert shown.capabilities == ["completion", "tools"]
    assert shown.modelinfo["general.architecture"] == "llama"
    assert "{%" in (shown.template or "")  # its chat template
    assert client.show(MINILM).capabilities == ["embedding"]
    with pytest.raises(ResponseError) as missing:
        client.show("nothing")
    assert missing.value.status_code == 404 and "nothing" in missing.value.error


def test_chat_streamed_and_whole_is_the_openai_routes_answer(served):
    _, client, openai = served
    options = {"temperature": 0, "num_predict": 6}
    whole = client.chat(model="tiny", messages=ASK, options=options, stream=False)
    same = openai.chat.completions.create(model="tiny", messages=ASK, max_tokens=6, temperature=0)
    assert whole.message.content == same.choices[0].message.content
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 6
    assert whole.prompt_eval_count == same.usage.prompt_tokens
    assert whole.total_duration >= whole.eval_duration > 0
    parts = list(client.chat(model="tiny", messages=ASK, options=options, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == 6 and parts[-1].done_reason == "length"
    running = [m.model for m in client.ps().models]
    assert running == [MINILM, "tiny"]


def test_generate_applies_the_chat_template_and_raw_does_not(served):
    _, client, openai = served
    options = {"temperature": 0, "num_predict": 5}
    templated = client.generate(model="tiny", prompt="Tell me about cats.", options=options)
    chat = client.chat(model="tiny", messages=ASK, options=options)
    assert templated.response == chat.message.content and templated.eval_count == 5
    raw = client.generate(model="tiny", prompt="Once upon", options=options, raw=True)
    legacy = openai.completions.create(
        model="tiny", prompt="Once upon", max_tokens=5, temperature=0
    )
    assert raw.response == legacy.choices[0].text
    streamed = "".join(
        p.response for p in client.generate(model="tiny", prompt="Once upon", options=options,
                                            raw=True, stream=True)
    )  # fmt: skip
    assert streamed == raw.response


def test_format_takes_a_json_schema_and_the_answer_follows_it(served):
    _, client, _ = served
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "lives": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["name", "lives"],
        "additionalProperties": False,
    }
    options = {"temperature": 0, "num_predict": 200}
    answer = client.chat(model="tiny", messages=ASK, format=schema, options=options)
    assert answer.done_reason == "stop"  # the grammar ended it, not the token limit
    jsonschema.validate(json.loads(answer.message.content), schema)
    whole = client.generate(model="tiny", prompt="A cat:", format="json", options=options)
    assert isinstance(json.loads(whole.response), dict)


def test_embed_one_and_many_as_the_openai_route_does(served):
    _, client, openai = served
    many = client.embed(model=MINILM, input=["a cat", "a dog"])
    want = [
        d.embedding for d in openai.embeddings.create(model=MINILM, input=["a cat", "a dog"]).data
    ]
    assert len(many.embeddings) == 2 and len(many.embeddings[0]) == 384
    assert max(abs(a - b) for a, b in zip(many.embeddings[1], want[1], strict=True)) < 1e-6
    assert many.prompt_eval_count and many.prompt_eval_count > 0
    one = client.embed(model=MINILM, input="a cat")
    assert one.embeddings[0] == many.embeddings[0]
    older = client.embeddings(model=MINILM, prompt="a cat")
    assert list(older.embedding) == list(one.embeddings[0])
    with pytest.raises(ResponseError) as wrong:
        client.embed(model="tiny", input="a cat")
    assert wrong.value.status_code == 400


def test_what_is_not_supported_is_a_400_that_says_so(served):
    live, client, _ = served
    picture = {"role": "user", "content": "what is this?", "images": ["aGVsbG8="]}
    with pytest.raises(ResponseError) as images:
        client.chat(model="tiny", messages=[picture])
    assert images.value.status_code == 400 and "images" in images.value.error
    bad = httpx.post(live.url + "/api/chat", json={"model": "tiny", "messages": "hi"})
    assert bad.status_code == 400 and isinstance(bad.json()["error"], str)


def _served_and_loaded(live: Live, client: Client) -> tuple[int, list[str]]:
    served = live.status()["counters"]["served_by_model"].get("tiny", 0)
    return served, [m.model for m in client.ps().models]


def test_load_and_unload_idioms_answer_as_ollama_and_generate_nothing(served):
    """Open WebUI's unload (`/api/generate`, empty prompt, keep_alive 0), Ollama's load
    (empty prompt) and the `ollama` CLI's (`/api/chat`, no messages), plain and streamed:
    answered as Ollama's server answers them (server/routes.go: done, done_reason "load"
    or "unload", no text, no counts), the model loaded or gone as /api/ps then says, and
    nothing queued or generated: no request is served for it beside the warm-up each load
    runs (an idiom for a model already loaded serves nothing)."""
    live, client, _ = served
    gone = client.generate(model="tiny", prompt="", keep_alive=0)
    assert (gone.done, gone.done_reason, gone.response) == (True, "unload", "")
    assert gone.eval_count is None and gone.prompt_eval_count is None
    assert "tiny" not in _served_and_loaded(live, client)[1]
    loaded = client.generate(model="tiny", prompt="")
    assert (loaded.done, loaded.done_reason, loaded.response) == (True, "load", "")
    served, running = _served_and_loaded(live, client)
    assert "tiny" in running
    # loaded already: nothing to do, answered at once (before, Open WebUI's unload ran a
    # generation from the empty prompt and answered after 91 s)
    started = time.perf_counter()
    chat = client.chat(model="tiny", messages=[])
    assert (chat.done_reason, chat.message.role, chat.message.content) == ("load", "assistant", "")
    (streamed,) = list(client.generate(model="tiny", prompt="", stream=True))
    assert streamed.done_reason == "load" and streamed.eval_count is None
    assert _served_and_loaded(live, client) == (served, [MINILM, "tiny"])
    (unloaded,) = list(client.generate(model="tiny", prompt="", keep_alive=0, stream=True))
    assert unloaded.done_reason == "unload"
    assert time.perf_counter() - started < 1.0  # three idioms and two looks at /api/ps
    assert _served_and_loaded(live, client) == (served, [MINILM])
    assert client.chat(model="tiny", messages=[], keep_alive="5m").done_reason == "load"
    served, running = _served_and_loaded(live, client)
    assert "tiny" in running
    (chat_gone,) = list(client.chat(model="tiny", messages=[], keep_alive=0, stream=True))
    assert chat_gone.done_reason == "unload" and chat_gone.eval_count is None
    assert _served_and_loaded(live, client) == (served, [MINILM])
    # the positive control: a prompt is answered (loading the model again), and counted
    answer = client.generate(model="tiny", prompt="Hi", options={"num_predict": 2})
    assert answer.done_reason == "length" and answer.eval_count == 2
    assert _served_and_loaded(live, client)[0] > served
    with pytest.raises(ResponseError) as embedder:  # Ollama: it "does not support generate"
        client.generate(model=MINILM, prompt="")
    assert embedder.value.status_code == 400


def test_a_name_with_ollamas_latest_tag_is_the_model_and_another_tag_is_a_404(served):
    """Ollama's clients name a model `NAME:latest` as often as `NAME` (`ollama run
    tiny:latest`): the same model, through chat, generate and embed; another tag names
    no model here."""
    _, client, _ = served
    plain = client.chat(model="tiny", messages=ASK, options={"num_predict": 3, "seed": 1})
    tagged = client.chat(model="tiny:latest", messages=ASK, options={"num_predict": 3, "seed": 1})
    assert tagged.message.content == plain.message.content and tagged.eval_count == 3
    assert client.generate(model="tiny:latest", prompt="Hi", options={"num_predict": 2}).done
    assert len(client.embed(model=f"{MINILM}:latest", input="a cat").embeddings[0]) == 384
    with pytest.raises(ResponseError) as other:
        client.chat(model="tiny:7b", messages=ASK)
    assert other.value.status_code == 404


def test_tags_and_ps_list_only_what_ollama_would(tmp_path):
    """Ollama lists the models it can chat or embed with; an image model (a simulated
    one here: its API needs no GPU to be listed) stays reachable through its own API."""
    models = (
        ModelSpec(name="sim", kind="simulated"),
        ModelSpec(name="painter", kind="simulated", images={"steps": 2}),
    )
    settings = make_settings(tmp_path, device="simulated:1GiB", models=models)
    with live_server(settings) as live:
        client = Client(host=live.url)
        assert [m.model for m in client.list().models] == ["sim"]
        assert [m.model for m in client.ps().models] == ["sim"]
        listed = OpenAI(base_url=live.url + "/v1", api_key="x").models.list().data
        assert [m.id for m in listed] == ["sim", "painter"]
        assert client.show("painter").modelinfo["vramgate.kind"] == "simulated"


def test_pull_with_progress_then_delete(served, tmp_path):
    live, client, _ = served
    model = save_random_bert(tmp_path / "src/tiny-embed", hidden=32, layers=1, heads=2, max_seq=64)
    wheel = save_model_wheel(model, tmp_path / "tiny_embed-1.0-py3-none-any.whl")
    events = list(client.pull(str(wheel), stream=True))
    assert events[-1].status == "success"
    counted = [e for e in events if e.total]
    assert counted and counted[-1].completed == counted[-1].total
    assert "tiny-embed" in [m.model for m in client.list().models]
    folder = live.app.state.models_source.settings().resolved_models_dir / "tiny-embed"
    assert (folder / "config.json").is_file()
    assert len(client.embed(model="tiny-embed", input="a cat").embeddings[0]) == 32
    assert client.delete("tiny-embed").status == "success"
    assert "tiny-embed" not in [m.model for m in client.list().models]
    assert not folder.exists()
    with pytest.raises(ResponseError) as gone:
        client.delete("tiny-embed")
    assert gone.value.status_code == 404


def test_pull_and_delete_refuse_callers_that_are_not_on_loopback(served, tmp_path):
    """As the admin routes do. With `host = 0.0.0.0` and a token (the LAN setup) a caller
    on the network must not pull (pip, or a path: a UNC one makes Windows sign in to its
    share) nor delete. Refused before the source is read: a path that does not exist is a
    403 here, not the 400 a loopback caller gets. The app sees the caller's LAN address."""
    live, client, _ = served
    model = save_random_bert(tmp_path / "src/lan-embed", hidden=32, layers=1, heads=2, max_seq=64)
    wheel = save_model_wheel(model, tmp_path / "lan_embed-1.0-py3-none-any.whl")
    lan = httpx.ASGITransport(app=live.app, client=("192.168.1.20", 50000))
    sources = [str(wheel), "\\\\192.0.2.1\\share\\model", str(tmp_path / "no-such-folder")]

    async def refused(call: Awaitable[object]) -> ResponseError:
        with pytest.raises(ResponseError) as error:
            await call
        return error.value

    async def calls() -> list[ResponseError]:
        other = AsyncClient(host="http://127.0.0.1", transport=lan)
        pulls = [await refused(other.pull(source)) for source in sources]
        return [*pulls, await refused(other.delete("tiny"))]

    for error in asyncio.run(calls()):
        assert error.status_code == 403, error
        assert error.error == "admin routes, pull and delete answer loopback callers only"
    assert [m.model for m in client.list().models] == ["tiny", MINILM]
    settings = live.app.state.models_source.settings()
    assert [m.name for m in settings.models] == [MINILM, "tiny"]
    assert not (settings.resolved_models_dir / "lan-embed").exists()
    local = httpx.post(live.url + "/api/pull", json={"model": sources[2]})
    assert local.status_code == 400  # the same source from this machine is read


@pytest.mark.slow
def test_smollm2_through_the_ollama_client_answers_and_follows_a_schema(smollm2, tmp_path):
    models = (
        ModelSpec(name=MINILM, kind="embedding"),
        ModelSpec(name="smollm2", kind="generation", path=smollm2),
    )
    settings = make_settings(tmp_path, device="cpu", models=models)
    with live_server(settings) as live:
        client = Client(host=live.url)
        question = [{"role": "user", "content": "What is the capital of France?"}]
        options = {"temperature": 0, "num_predict": 12}
        whole = client.chat(model="smollm2", messages=question, options=options)
        assert "Paris" in whole.message.content
        streamed = client.chat(model="smollm2", messages=question, options=options, stream=True)
        assert "".join(p.message.content for p in streamed) == whole.message.content
        schema = {
            "type": "object",
            "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["city", "country"],
        }
        shaped = client.chat(
            model="smollm2",
            messages=question,
            format=schema,
            options={"temperature": 0, "num_predict": 60},
        )
        answer = json.loads(shaped.message.content)
        jsonschema.validate(answer, schema)
        assert "Paris" in answer["city"]
        generated = client.generate(model="smollm2", prompt="What is the capital of France?",
                                    options=options)  # fmt: skip
        assert "Paris" in generated.response
        assert len(client.embed(model=MINILM, input=["a", "b", "c"]).embeddings) == 3
        assert [m.model for m in client.ps().models] == [MINILM, "smollm2"]


def _serve_with_ollama_port(tmp_path, port: int) -> ServerProcess:
    return ServerProcess(
        [
            sys.executable, "-m", "app", "serve", "--device", "simulated:1GiB",
            "--model", "sim=simulated", "--ollama-port", str(port),
            "--data-dir", str(tmp_path / "d"), "--log-dir", str(tmp_path / "l"),
        ]
    )  # fmt: skip


def test_a_second_listener_on_the_ollama_port_serves_behind_the_same_guard(tmp_path):
    second = free_port()
    server = _serve_with_ollama_port(tmp_path, second)
    try:
        server.wait_ready(120)
        client = Client(host=f"http://127.0.0.1:{second}")
        assert [m.model for m in client.list().models] == ["sim"]
        other = f"http://127.0.0.1:{second}/api/tags"
        assert httpx.get(other, headers={"Host": "evil.example"}).status_code == 403
        page = {"Origin": "http://evil.example", "Content-Type": "application/json"}
        refused = httpx.post(f"http://127.0.0.1:{second}/api/embed", headers=page,
                             content=b'{"model": "sim", "input": "w"}')  # fmt: skip
        assert refused.status_code == 403
        assert httpx.get(server.url + "/api/tags").status_code == 200  # the main port too
    finally:
        assert server.stop() == 0


def test_an_ollama_port_in_use_is_said_and_the_server_runs_on(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = _serve_with_ollama_port(tmp_path, port)
        try:
            server.wait_ready(120)
            assert httpx.get(server.url + "/api/tags").status_code == 200
        finally:
            assert server.stop() == 0
        output = server.process.stdout.read()
    assert f"not listening on port {port} for Ollama's API: it is in use" in output


def test_ps_with_a_keep_alive_longer_than_any_date(served):
    """Found by the fuzz test: a keep_alive of 1e300 s overflowed expires_at (500)."""
    _, client, _ = served
    client.embed(model=MINILM, input="a cat", keep_alive=1e300)
    running = {m.model: m for m in client.ps().models}
    assert running[MINILM].expires_at is not None and running[MINILM].expires_at.year == 9999
    client.embed(model=MINILM, input="a cat", keep_alive=-1)


def test_show_never_hands_out_a_file_a_models_template_links_to(tmp_path):
    """A model folder whose chat template is a link to a private file (a key): `/api/show`
    reads the model's card, which refuses links, and the key stays private."""
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n")
    tiny = save_random_llama(tmp_path / "tiny", context=256)
    (tiny / "chat_template.jinja").unlink(missing_ok=True)
    (tiny / "chat_template.jinja").symlink_to(secret)
    spec = ModelSpec(name="tiny", kind="generation", path=tiny)
    settings = make_settings(tmp_path, device="cpu", models=(spec,))
    with live_server(settings, ready=False) as live:
        shown = Client(host=live.url).show("tiny")
    assert "PRIVATE KEY" not in (shown.template or "")
    assert "secret" not in json.dumps(shown.model_dump(mode="json"))


def test_show_and_tags_of_a_gguf_say_its_engine_format_and_quantization(smollm2_gguf, tmp_path):
    from app.engines.gguf_facts import read_gguf_facts

    spec = ModelSpec(name="smol", kind="generation", path=smollm2_gguf, context_length=1024)
    settings = make_settings(tmp_path, device="cpu", models=(spec,))
    with live_server(settings, ready=False) as live:
        client = Client(host=live.url)
        shown = client.show("smol")
        (listed,) = client.list().models
        models = OpenAI(base_url=live.url + "/v1", api_key="x").models.list().data
    assert shown.template == read_gguf_facts(smollm2_gguf).chat_template
    assert shown.capabilities == ["completion", "tools"]
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 1024
    assert shown.modelinfo["vramgate.engine"] == "llama.cpp"
    assert (shown.details.format, shown.details.quantization_level) == ("gguf", "Q4_1")
    assert listed.details.family == "llama"
    assert models[0].model_dump()["engine"] == "llama.cpp"


def test_a_pulled_gguf_is_deleted_with_its_folder_and_projector(served, tmp_path):
    """A GGUF is kept in a folder of its own (with its mmproj): deleting the model takes
    the folder, not the file alone."""
    live, client, _ = served
    llama = save_random_llama(tmp_path / "src-llama", context=64)
    source = tmp_path / "src"
    source.mkdir()
    from tests.support.random_models import save_random_llama_gguf

    gguf = save_random_llama_gguf(llama, source / "tiny-gguf.gguf")
    (source / "mmproj-tiny.gguf").write_bytes(b"projector")
    assert list(client.pull(str(gguf), stream=True))[-1].status == "success"
    folder = live.app.state.models_source.settings().resolved_models_dir / "tiny-gguf"
    assert sorted(p.name for p in folder.iterdir()) == ["mmproj-tiny.gguf", "tiny-gguf.gguf"]
    assert client.delete("tiny-gguf").status == "success"
    assert not folder.exists()
    assert "tiny-gguf" not in [m.model for m in client.list().models]


def test_num_predict_past_the_context_stops_at_it_as_ollama_does(served):
    """Ollama's num_predict past the context answers until the context is full (Ollama
    stops there); OpenAI's max_tokens past it is a 400 naming both numbers."""
    import openai as openai_errors

    _, client, openai = served
    answer = client.chat(
        model="tiny", messages=ASK, options={"temperature": 0, "num_predict": 5000}
    )
    assert answer.done_reason == "length"
    assert answer.prompt_eval_count + answer.eval_count == 1024  # the tiny model's context
    with pytest.raises(openai_errors.BadRequestError) as refused:
        openai.chat.completions.create(model="tiny", messages=ASK, max_tokens=5000)
    assert refused.value.body["code"] == "context_length_exceeded"
    assert "5000 in the completion" in refused.value.body["message"]
