"""Callers told apart (app.api.callers): the prefix cache is no oracle across them. On a
small random Llama served on the CPU (torch engine), with the official `openai` and
`anthropic` clients: one caller guessing at another's system prompt (a PIN in it) reads
back no cached tokens, whichever way callers differ (their API key, OpenAI's `user`,
Anthropic's `metadata.user_id`), from kept and from running prefixes alike; each
caller's own repeats are served from the cache beside it. Before, the guesses'
`cached_tokens` grew as they came closer to the PIN."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from anthropic import Anthropic
from openai import OpenAI
from starlette.requests import Request

from app.api.callers import cache_scope
from app.config.settings import ModelSpec
from app.models.prefix_cache import MIN_CACHED
from tests.support.live import Live, live_server, make_settings
from tests.support.random_models import save_random_llama

RULES = " ".join(f"rule {i}: answer briefly." for i in range(12))


def system(pin: str) -> str:
    return f"The vault PIN is {pin}. Never say it. {RULES}"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    folder = save_random_llama(tmp_path_factory.mktemp("llama"), context=2048)
    spec = ModelSpec(name="llama", kind="generation", path=folder, load="startup")
    settings = make_settings(tmp_path_factory.mktemp("server"), device="cpu", models=(spec,))
    with live_server(settings) as server:
        yield server


def openai(live: Live, key: str) -> OpenAI:
    return OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0)


def cached(client: OpenAI, pin: str, question: str = "hello", **extra: Any) -> int:
    reply = client.chat.completions.create(
        model="llama",
        messages=[
            {"role": "system", "content": system(pin)},
            {"role": "user", "content": question},
        ],
        max_tokens=2,
        temperature=0,
        **extra,
    )
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens_details.cached_tokens or 0


def test_guesses_at_another_keys_system_prompt_read_back_no_cached_tokens(live):
    """Each guess from a key of its own (its own earlier prompts would be hits, rightly):
    before, they read back 23, 24, 25 and 26 cached tokens as their digits came right."""
    owner = openai(live, "app-owner")
    assert cached(owner, "4831") == 0
    pins = ("1000", "4000", "4800", "4830", "4831")
    guesses = [cached(openai(live, f"app-guesser-{pin}"), pin) for pin in pins]
    assert guesses == [0] * 5
    # the positive controls: each caller's own repeat is a hit, the owner's of its prompt
    assert cached(owner, "4831", "hello again") >= MIN_CACHED
    assert cached(openai(live, "app-guesser-4831"), "4831", "hello again") >= MIN_CACHED


def test_openai_user_and_anthropic_user_id_tell_callers_apart_under_one_key(live):
    one_key = openai(live, "shared-key")
    assert cached(one_key, "2222", user="alice") == 0
    assert cached(one_key, "2222", user="bob") == 0  # alice's prompt, exactly
    assert cached(one_key, "2222", "again", user="alice") >= MIN_CACHED
    assert cached(one_key, "2222", "again", safety_identifier="carol") == 0

    claude = Anthropic(base_url=live.url, api_key="shared-key", max_retries=0)

    def read(user: str, question: str) -> int:
        message = claude.messages.create(
            model="llama",
            system=system("3333"),
            messages=[{"role": "user", "content": question}],
            max_tokens=2,
            metadata={"user_id": user},
        )
        return message.usage.cache_read_input_tokens or 0

    assert read("dana", "hello") == 0
    assert read("erin", "hello") == 0
    assert read("dana", "hello again") >= MIN_CACHED


def test_a_running_prompt_is_copied_only_by_its_own_caller(live):
    """Rows running beside a new prompt donate their prefix's KV: to the same caller's
    prompt (the control), not to another's."""
    body = {
        "model": "llama",
        "messages": [{"role": "system", "content": system("5555")}],
        "max_tokens": 1500,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": "Bearer app-owner"}
    with (
        httpx.Client(base_url=live.url, timeout=120) as http,
        http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as stream,
    ):
        lines = stream.iter_lines()
        while '"content"' not in next(lines):
            pass  # its first token: it runs now, and will for 1,500 tokens
        other = cached(openai(live, "app-guesser"), "5555", "what is it?")
        mine = cached(openai(live, "app-owner"), "5555", "what is it?")
        assert http.get("/status").json()["queue"]["running"] >= 1  # still running
    assert other == 0
    assert mine >= MIN_CACHED


def scope_of(headers: dict[str, str], client: str = "127.0.0.1", *ids: str | None) -> str:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    request = Request({"type": "http", "headers": raw, "client": (client, 5000)})
    return cache_scope(request, *ids)


def test_a_scope_is_the_same_for_the_same_caller_and_differs_by_each_part():
    base = scope_of({"Authorization": "Bearer k"}, "127.0.0.1", "u")
    assert base == scope_of({"Authorization": "Bearer k"}, "127.0.0.1", "u")
    others = {
        scope_of({"Authorization": "Bearer j"}, "127.0.0.1", "u"),
        scope_of({"x-api-key": "k"}, "127.0.0.1", "u"),
        scope_of({"Authorization": "Bearer k"}, "127.0.0.2", "u"),
        scope_of({"Authorization": "Bearer k"}, "127.0.0.1", "v"),
        scope_of({"Authorization": "Bearer k"}, "127.0.0.1", None, "u"),
    }
    assert base not in others and len(others) == 5
    assert "k" not in base and len(base) == 32  # a digest: the credential is not kept
