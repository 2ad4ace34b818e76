"""Classes over real HTTP, from what clients send (the official `openai` client's
`service_tier`, vLLM's `priority`, the header, the config's table), with the simulated
device and model (config choices): its chats last a step count the tests choose."""

from __future__ import annotations

import asyncio
import time

import httpx
from openai import OpenAI

from app.config.settings import ModelSpec, SimulatedBucket, SimulatedGeneration

MiB = 2**20
SIM = ModelSpec(
    name="sim",
    kind="simulated",
    buckets=(SimulatedBucket(size=256, bytes=10 * MiB, run_ms=5),),
    generation=SimulatedGeneration(step_ms=10),
)


def ask(text: str = "hello there", **extra) -> dict:
    return {"model": "sim", "messages": [{"role": "user", "content": text}], **extra}


def test_service_tier_reaches_the_class_through_the_openai_client_and_comes_back(
    server_factory, caplog
):
    live = server_factory(
        device="simulated:4GiB",
        models=(SIM,),
        model_aliases={"task": "sim"},
        priorities={"task": "background"},
    )
    caplog.set_level("INFO", logger="vramgate")
    client = OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
    messages = ask()["messages"]
    flex = client.chat.completions.with_raw_response.create(
        model="sim", messages=messages, max_tokens=2, service_tier="flex"
    )
    assert flex.headers["x-vramgate-priority"] == "background"
    assert flex.parse().service_tier == "flex"
    plain = client.chat.completions.with_raw_response.create(
        model="sim", messages=messages, max_tokens=2
    )  # the twin that asks nothing: interactive, OpenAI's "default"
    assert plain.headers["x-vramgate-priority"] == "interactive"
    assert plain.parse().service_tier == "default"
    streamed = client.chat.completions.create(
        model="sim", messages=messages, max_tokens=2, service_tier="priority", stream=True
    )
    assert {chunk.service_tier for chunk in streamed} == {"priority"}
    # vLLM's number, the header, and the config's class for the name sent
    vllm = client.embeddings.with_raw_response.create(
        model="sim", input="a b", extra_body={"priority": 5}
    )
    assert vllm.headers["x-vramgate-priority"] == "background"
    header = httpx.post(
        live.url + "/v1/chat/completions",
        json=ask(max_tokens=2),
        headers={"X-Vramgate-Priority": "background"},
        timeout=30,
    )
    assert header.json()["service_tier"] == "flex"
    task = client.chat.completions.create(model="task", messages=messages, max_tokens=2)
    assert task.service_tier == "flex"
    # listed on its own, so that an app that picks models from the list can pick it
    listed = {m.id: m for m in client.models.list()}
    assert listed["task"].model_extra["priority"] == "background"
    assert (
        listed["task"].model_extra["alias_of"] == "sim"
        and "priority" not in listed["sim"].model_extra
    )
    own = client.chat.completions.create(
        model="task", messages=messages, max_tokens=2, service_tier="default"
    )
    assert own.service_tier == "default"  # the request's own word wins over the table
    # OpenAI's Responses API takes and tells the tier the same way
    answer = client.responses.create(
        model="sim", input="hello there", max_output_tokens=2, service_tier="flex"
    )
    assert answer.service_tier == "flex"
    log = "\n".join(record.getMessage() for record in caplog.records)
    assert "class=background" in log and "class=priority" in log


async def _chat(client: httpx.AsyncClient, name: str, tokens: int, ended: list[str], **extra):
    reply = await client.post("/v1/chat/completions", json=ask(name, max_tokens=tokens, **extra))
    assert reply.status_code == 200, reply.text
    ended.append(name)


def test_a_background_chat_sent_before_an_interactive_one_is_served_after_it(server_factory):
    """One stream slot. A chat runs; a `flex` chat is sent, then a plain one: the plain
    one runs next. Before classes (first come, first served) the flex one did."""
    live = server_factory(device="simulated:4GiB", models=(SIM,), max_streams=1)

    async def scenario() -> list[str]:
        ended: list[str] = []
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            first = asyncio.ensure_future(_chat(client, "first", 60, ended))
            await asyncio.sleep(0.2)
            flex = asyncio.ensure_future(_chat(client, "flex", 5, ended, service_tier="flex"))
            await asyncio.sleep(0.2)
            person = asyncio.ensure_future(_chat(client, "person", 5, ended))
            await asyncio.gather(first, flex, person)
        return ended

    assert asyncio.run(scenario()) == ["first", "person", "flex"]


def test_aging_bounds_a_background_wait_under_a_steady_interactive_stream(server_factory):
    """Two clients send interactive chats back to back for 8 s, so one always waits;
    a background chat sent among them waits for its aging (1 s here), then runs: it ends
    long before they stop. Without aging it waits for all of them."""
    live = server_factory(
        device="simulated:4GiB", models=(SIM,), max_streams=1, background_aging_s=1.0
    )

    async def scenario() -> tuple[float, float]:
        ended: list[str] = []
        stop_at = time.monotonic() + 8

        async def person(name: str) -> None:
            while time.monotonic() < stop_at:
                await _chat(client, name, 20, ended)  # ~0.2 s each

        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            people = [asyncio.ensure_future(person(f"p{i}")) for i in range(2)]
            await asyncio.sleep(0.5)
            sent = time.monotonic()
            await _chat(client, "flex", 5, ended, service_tier="flex")
            waited = time.monotonic() - sent
            await asyncio.gather(*people)
            return waited, time.monotonic() - sent

    waited, flood_s = asyncio.run(scenario())
    assert waited < flood_s / 2, f"background waited {waited:.1f} s of the flood's {flood_s:.1f}"


def test_a_caller_pattern_gives_a_program_its_class_by_its_user_agent(server_factory):
    """`caller:` patterns of the [priorities] table read the User-Agent: an indexing
    script's requests are background without a field of its own, through the official
    client; the same client under its own name stays interactive, and a request's own
    word still wins."""
    live = server_factory(
        device="simulated:4GiB",
        models=(SIM,),
        priorities={"caller:my-indexer/*": "background", "/v1/embeddings": "priority"},
    )
    messages = ask()["messages"]

    def client(agent: str | None) -> OpenAI:
        headers = {"User-Agent": agent} if agent else None
        return OpenAI(
            base_url=live.url + "/v1", api_key="x", max_retries=0, default_headers=headers
        )

    indexer = client("my-indexer/2.1")
    plain = client(None)  # the openai client's own User-Agent
    answers = {
        "indexer": indexer.chat.completions.create(model="sim", messages=messages, max_tokens=2),
        "plain": plain.chat.completions.create(model="sim", messages=messages, max_tokens=2),
        "own": indexer.chat.completions.create(
            model="sim", messages=messages, max_tokens=2, service_tier="priority"
        ),
    }
    assert {k: a.service_tier for k, a in answers.items()} == {
        "indexer": "flex",
        "plain": "default",
        "own": "priority",
    }
    # the caller's pattern comes before the route's
    routed = indexer.embeddings.with_raw_response.create(model="sim", input="a b")
    assert routed.headers["x-vramgate-priority"] == "background"
    other = plain.embeddings.with_raw_response.create(model="sim", input="a b")
    assert other.headers["x-vramgate-priority"] == "priority"
