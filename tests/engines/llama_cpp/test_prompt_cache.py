"""The host prompt cache of llama.cpp's engine keeps conversations (app.engines.llama_cpp
.runner_model `_sized_cache`), on the real SmolLM2 GGUF through the `openai` client, as
Open WebUI uses it: a chat whose system prompt carries an app's tools, then the app's own
one-off task requests (a title, tags, follow-ups), then the chat's next turn and a new
chat with the same tools. Both find their prefix in the cache, as `cached_tokens` says."""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest
from openai import OpenAI

from app.engines.gguf_facts import read_gguf_facts
from app.engines.llama_cpp.runner_model import PROMPT_CACHE_MAX
from tests.engines.llama_cpp.pools import serving
from tests.support.live import Live

pytestmark = pytest.mark.slow
CONTEXT, PARALLEL = 2048, 4
TOOLS = " ".join(
    f"Tool {i}: get_{i}(city: string, days: integer) returns the weather of day {i}."
    for i in range(44)
)  # about 1,300 tokens, as an app's tools in every chat
TASKS = ("Write a title of three words for: ", "Write three tags for: ", "Suggest a question on: ")


@pytest.fixture(scope="module")
def live(smollm2_gguf, tmp_path_factory) -> Iterator[Live]:
    with serving(smollm2_gguf, tmp_path_factory.mktemp("prompt-cache"), CONTEXT, PARALLEL) as up:
        yield up


def ask(client: OpenAI, messages: list[dict[str, str]]) -> tuple[str, int, int]:
    reply = client.chat.completions.create(
        model="smol", messages=messages, max_tokens=8, temperature=0
    )
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    return reply.choices[0].message.content or "", usage.prompt_tokens, cached


def test_a_conversation_and_a_new_chat_find_their_prefix_after_the_apps_task_requests(
    live, smollm2_gguf
):
    """Before (a cache of one request's KV, 46 MiB here): the task requests pushed the
    conversation out, and turn 2 and the new chat prefilled the tools again."""
    client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    chat = [{"role": "system", "content": TOOLS}, {"role": "user", "content": "Weather?"}]
    answer, first, _ = ask(client, chat)
    assert first > 1_100
    history = " ".join(m["content"] for m in chat) + " " + answer
    for task in TASKS:  # each a long prompt of its own, sent between two turns
        ask(client, [{"role": "user", "content": task + history[::-1]}])
    chat += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And now?"}]
    _, second, reused = ask(client, chat)
    assert reused >= first - 8, (first, second, reused)  # its whole first turn
    other = [{"role": "system", "content": TOOLS}, {"role": "user", "content": "Rain?"}]
    _, _, shared = ask(client, other)
    assert shared >= first - 16, (first, shared)  # the tools, from the first chat
    (row,) = [m for m in live.status()["models"] if m["name"] == "smol"]
    one_request = read_gguf_facts(smollm2_gguf).kv_bytes_per_token("f16") * CONTEXT
    cache = row["prompt_cache_ram_bytes"]
    quarter = psutil.virtual_memory().total // 4
    assert one_request < cache <= min(quarter, PROMPT_CACHE_MAX), (one_request, cache)
