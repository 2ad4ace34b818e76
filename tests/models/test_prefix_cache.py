"""The prefix cache (app.models.prefix_cache): the store's rules; on the torch engine, a
resent conversation is not prefilled again and answers exactly as without the cache; on a
simulated GPU, kept prefixes give way to a flood of distinct prompts with no
out-of-memory and no refusal."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest
from openai import OpenAI

from app.config.settings import ModelSpec, SimulatedBucket, SimulatedGeneration
from app.models.prefix_cache import MIN_CACHED, Entry, PrefixStore
from tests.support.live import wait_until
from tests.support.random_models import save_random_llama

MiB = 2**20


def _entry(model: str, ids: list[int], nbytes: int, released: list[str]) -> Entry:
    return Entry(model, tuple(ids), nbytes, None, lambda: released.append(f"{model}{len(ids)}"))


def test_store_finds_the_longest_prefix_of_the_same_model_and_leaves_one_token_to_compute():
    store, released = PrefixStore(), []
    store.set_limit(10 * MiB)
    assert store.put(_entry("a", list(range(40)), MiB, released))
    assert store.put(_entry("b", list(range(80)), MiB, released))
    entry, count = store.longest("a", list(range(60)))
    assert entry is not None and entry.model == "a" and count == 40
    _, whole = store.longest("a", list(range(40)))
    assert whole == 39  # the last prompt token is fed: its logits give the first new token
    assert store.longest("a", [*range(MIN_CACHED - 1), 999]) == (None, 0)  # too short a share
    assert store.view()["lookups"] == 3 and store.view()["hits"] == 2


def test_store_keeps_within_its_limit_evicting_least_recently_used_and_longer_replaces_prefix():
    store, released = PrefixStore(), []
    store.set_limit(3 * MiB)
    for start in (0, 100, 200):
        assert store.put(_entry("m", list(range(start, start + 20)), MiB, released))
    store.longest("m", list(range(0, 30)))  # the first is used again: the second is oldest
    assert store.put(_entry("m", list(range(300, 320)), MiB, released))
    assert released == ["m20"] and store.held_bytes == 3 * MiB
    assert not store.longest("m", list(range(100, 130)))[0]  # it was the one evicted
    # a longer conversation replaces its own prefix
    assert store.put(_entry("m", list(range(300, 340)), MiB, released))
    assert store.view()["entries"] == 3 and store.covers("m", list(range(300, 330)))
    # the limit shrinks (a permit took the room): entries go, oldest first
    freed = store.set_limit(MiB)
    assert freed == 2 * MiB and store.held_bytes == MiB and store.view()["evicted"] == 3
    # an entry bigger than the room is not kept, and is released at once
    assert not store.put(_entry("m", list(range(500, 540)), 2 * MiB, released))
    assert released[-1] == "m40" and store.held_bytes == MiB
    assert store.drop_model("m") == MiB and len(store) == 0


def test_store_forgets_what_went_unused_for_its_models_keep_alive():
    store, released = PrefixStore(), []
    store.set_limit(10 * MiB)
    store.put(_entry("a", list(range(20)), MiB, released))
    store.put(_entry("b", list(range(20)), MiB, released))
    assert store.expire("a", 3600) == 0 and len(store) == 2  # used within the hour
    assert store.expire("a", 0) == MiB and released == ["a20"]  # idle past a keep-alive of 0
    assert store.longest("b", list(range(30)))[1] == 20  # another model's entry stays


def test_store_finds_and_replaces_only_its_own_scopes_entries():
    """Two callers' scopes: the same prompt kept by one is no hit for the other (its
    lookup finds nothing, `covers` says it is not held), and keeping it under the other
    scope leaves the first one's entry in place; the same scope finds its own."""
    store, released = PrefixStore(), []
    store.set_limit(10 * MiB)
    ids = list(range(40))
    assert store.put(Entry("m", tuple(ids), MiB, None, lambda: released.append("a"), scope="a"))
    assert store.longest("m", [*ids, 7], scope="b") == (None, 0)
    assert not store.covers("m", ids, "b")
    entry, count = store.longest("m", [*ids, 7], scope="a")  # the positive control
    assert entry is not None and entry.scope == "a" and count == 40
    assert store.covers("m", ids, "a")
    longer = tuple(range(60))  # b's longer copy holds a's prefix, but a's entry is a's
    assert store.put(Entry("m", longer, MiB, None, lambda: released.append("b"), scope="b"))
    assert released == [] and len(store) == 2
    assert store.longest("m", [*ids, 7], scope="a")[1] == 40
    assert store.make_room("m", tuple(range(80)), MiB, "a")  # a's own longer one replaces it
    assert released == ["a"] and store.longest("m", list(range(70)), scope="b")[1] == 60


@pytest.fixture(scope="module")
def llama_twice(tmp_path_factory: pytest.TempPathFactory):
    """One small random Llama served twice: "cached" with the prefix cache, "plain"
    without it, both in float32. On the CPU a model's dtype is otherwise the faster one
    measured at load (app.engines.torch.generation.cpu_dtype), and on a busy machine the
    two loads can measure differently: one in bfloat16, the other in float32, whose greedy
    answers part (seen in a full run: the first, uncached turns differed)."""
    from tests.support.live import live_server, make_settings

    folder = save_random_llama(tmp_path_factory.mktemp("llama"), context=2048)
    same = {"kind": "generation", "path": folder, "load": "startup", "dtype": "float32"}
    specs = (
        ModelSpec(name="cached", **same),
        ModelSpec(name="plain", prefix_cache=False, **same),
    )
    settings = make_settings(tmp_path_factory.mktemp("server"), device="cpu", models=specs)
    with live_server(settings) as live:
        yield live


def test_torch_engine_resent_conversation_reuses_its_prefix_and_answers_the_same(llama_twice):
    """An agent's turns: the same long system prompt and a history that grows. With the
    cache, each turn after the first reports most of its prompt as cached; its greedy
    answer (random weights: its text is noise, but deterministic noise) equals the one
    computed without the cache, token for token: a prefix copied at the wrong positions
    or missing a token would change it."""
    warmed = httpx.get(llama_twice.url + "/status").json()["prefix_cache"]
    assert warmed["lookups"] == 0 and warmed["entries"] == 0  # warm-up neither used nor filled it
    client = OpenAI(base_url=llama_twice.url + "/v1", api_key="unused", max_retries=0)
    system = " ".join(f"rule {i}: answer briefly." for i in range(50))
    answers: dict[str, list[str]] = {"cached": [], "plain": []}
    reused: list[tuple[int, int]] = []
    for model in ("cached", "plain"):
        messages = [{"role": "system", "content": system}]
        for turn in range(3):
            messages.append({"role": "user", "content": f"question {turn}"})
            reply = client.chat.completions.create(
                model=model, messages=messages, max_tokens=8, temperature=0
            )
            text = reply.choices[0].message.content or ""
            answers[model].append(text)
            messages.append({"role": "assistant", "content": text})
            details = reply.usage.prompt_tokens_details
            if model == "cached":
                reused.append((reply.usage.prompt_tokens, details.cached_tokens))
            else:
                assert details.cached_tokens == 0
    assert answers["cached"] == answers["plain"]
    assert reused[0][1] == 0  # nothing kept yet
    assert all(cached >= prompt // 2 for prompt, cached in reused[1:]), reused
    cache = httpx.get(llama_twice.url + "/status").json()["prefix_cache"]
    assert cache["bytes"] > 0 and cache["entries"] >= 1 and cache["hits"] == 2
    metrics = httpx.get(llama_twice.url + "/metrics").text
    assert 'vramgate_prefix_cache_hits{device="cpu"} 2.0' in metrics


def test_torch_engine_short_prompts_in_one_group_copy_from_the_cache(llama_twice):
    """Prompts under a prefill chunk are prefilled together, each copying its kept
    prefix: two at once after one that ended, both cached, both as without the cache."""
    client = OpenAI(base_url=llama_twice.url + "/v1", api_key="unused", max_retries=0)
    prompt = "one two three four five six seven eight nine ten " * 4

    def ask(model: str, tail: str) -> tuple[str, int]:
        reply = client.completions.create(
            model=model, prompt=prompt + tail, max_tokens=6, temperature=0
        )
        return reply.choices[0].text, reply.usage.prompt_tokens_details.cached_tokens

    ask("cached", "")

    async def both(model: str) -> list[tuple[str, int]]:
        return list(await asyncio.gather(*(asyncio.to_thread(ask, model, t) for t in "ab")))

    cached, plain = asyncio.run(both("cached")), asyncio.run(both("plain"))
    assert [text for text, _ in cached] == [text for text, _ in plain]
    assert all(count >= MIN_CACHED for _, count in cached), cached


GENERATION = SimulatedGeneration(
    kv_bytes_per_token=1 * MiB,
    fixed_bytes=32 * MiB,
    true_kv_bytes_per_token=1 * MiB,
    true_fixed_bytes=32 * MiB,
    step_ms=2,
    answer_tokens=(8, 16),
)


def test_simulated_gpu_flood_of_distinct_prompts_evicts_kept_prefixes_without_oom_or_refusal(
    server_factory,
):
    """A simulated 2 GiB GPU. A conversation's turns fill the prefix cache (each
    turn's KV kept: 1 MiB a token); then 48 clients send distinct 300-word prompts, each
    admitted for ~330 MiB: the kept prefixes must give their bytes to admitted jobs
    (else the simulated device raises out-of-memory) and never make a request wait past
    its deadline or be refused."""
    model = ModelSpec(
        name="sim",
        kind="simulated",
        generation=GENERATION,
        buckets=(SimulatedBucket(size=4096, bytes=MiB, run_ms=1),),
    )
    live = server_factory(device="simulated:2GiB", max_queue=1000, models=(model,))
    history = " ".join(f"w{i}" for i in range(400))
    cached_turns = []
    with live.client() as client:
        for turn in range(4):
            body = {
                "model": "sim",
                "messages": [{"role": "user", "content": history}],
                "max_tokens": 16,
            }
            answer = client.post("/v1/chat/completions", json=body).json()
            cached_turns.append(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
            history += " " + answer["choices"][0]["message"]["content"] + f" next{turn}"
        before = client.get("/status").json()["prefix_cache"]
    assert cached_turns[0] == 0 and all(c >= 400 for c in cached_turns[1:]), cached_turns
    assert before["bytes"] >= 400 * MiB

    async def flood() -> Counter[int]:
        codes: Counter[int] = Counter()
        async with httpx.AsyncClient(base_url=live.url, timeout=120) as client:

            async def one(index: int) -> None:
                words = " ".join(f"f{index}x{i}" for i in range(300))
                body = {"model": "sim", "prompt": words, "max_tokens": 16}
                codes[(await client.post("/v1/completions", json=body)).status_code] += 1

            await asyncio.gather(*(one(i) for i in range(48)))
        return codes

    codes = asyncio.run(flood())
    status = httpx.get(live.url + "/status").json()
    print(f"\nbefore the flood {before}; after {status['prefix_cache']}; answers {dict(codes)}")
    assert codes == Counter({200: 48})
    assert status["device"]["ooms"] == 0
    assert status["prefix_cache"]["evicted"] > 0  # the flood took the kept bytes


def test_simulated_gpu_other_program_pressing_takes_the_kept_prefixes_first(server_factory):
    """Another program takes memory until the device has less free than the reserve:
    the kept prefixes go (the model stays loaded: it is not what pressed), and the
    device gets the bytes back (housekeeping re-plans every tick, which fits the store
    to the pool: with the device keeping the reserve free, the pool is what we hold)."""
    model = ModelSpec(
        name="sim",
        kind="simulated",
        generation=GENERATION,
        buckets=(SimulatedBucket(size=4096, bytes=MiB, run_ms=1),),
    )
    live = server_factory(
        device="simulated:2GiB", reserve=256 * MiB, headroom=64 * MiB, models=(model,)
    )
    with live.client() as client:
        body = {"model": "sim", "prompt": " ".join(f"w{i}" for i in range(400)), "max_tokens": 8}
        assert client.post("/v1/completions", json=body).status_code == 200
        kept = client.get("/status").json()["prefix_cache"]["bytes"]
    assert kept >= 400 * MiB
    device = live.service.device
    device.set_external(2048 * MiB - kept - 100 * MiB)  # 100 MiB free: under the reserve
    wait_until(lambda: live.status()["prefix_cache"]["bytes"] == 0, 5, "the cache given back")
    status = live.status()
    assert status["prefix_cache"]["evicted"] == 1
    assert [m["state"] for m in status["models"]] == ["ready"]
    assert device.snapshot().free >= 256 * MiB and device.oom_count == 0


def test_torch_engine_an_ended_rows_copy_is_made_only_once_the_store_has_room_for_it(
    tmp_path, monkeypatch
):
    """The copy of an ended row's KV takes device bytes as it is made: the older
    entries it displaces must go before it, not after (else the store holds its limit
    plus the copy for a moment: bytes neither a permit nor the limit covers)."""
    from app.devices.cpu import CpuDevice
    from app.engines.torch.generation import step_batch
    from app.engines.torch.generation.causal_lm import CausalLMHandler
    from app.models.decoding import SamplingParams, TokenStream

    folder = save_random_llama(tmp_path / "llama", context=1024)
    handler = CausalLMHandler(ModelSpec(name="m", kind="generation", path=folder))
    store = handler.prefix_store = PrefixStore()
    store.set_limit(2**40)
    handler.load(CpuDevice())
    seen: list[tuple[int, int, int]] = []  # (held, copy, limit) as each copy is made
    real = step_batch.kept_row

    def spy(batch, index):
        kept = real(batch, index)
        seen.append((store.held_bytes, kept.nbytes, store.limit))
        return kept

    monkeypatch.setattr(step_batch, "kept_row", spy)
    loop = asyncio.new_event_loop()
    try:

        def ask(prompt: str) -> None:
            params = SamplingParams(max_tokens=4, temperature=0.0)
            prepared = handler.prepare_generation(prompt, params, 4)
            handler.generate(prepared, TokenStream(loop))

        ask(" ".join(f"alpha{i}" for i in range(40)))
        assert len(store) == 1
        store.set_limit(store.held_bytes * 3 // 2)  # room for one such entry, not two
        ask(" ".join(f"beta{i}" for i in range(40)))
    finally:
        loop.close()
        handler.unload()
    assert len(seen) == 2 and len(store) == 1
    held, copy, limit = seen[1]
    assert held + copy <= limit, f"{held} held + a {copy}-byte copy over the limit {limit}"


def test_torch_engine_a_hit_is_counted_only_where_the_kept_prefix_is_copied(tmp_path):
    """/status's hits and tokens_reused count the prompts that read a kept prefix: one
    that copies a running row's longer prefix instead reads nothing from the store."""
    import threading
    import time

    from app.devices.cpu import CpuDevice
    from app.engines.torch.generation.causal_lm import CausalLMHandler
    from app.models.decoding import DecodeResult, SamplingParams, TokenStream

    folder = save_random_llama(tmp_path / "llama", context=1024)
    handler = CausalLMHandler(ModelSpec(name="m", kind="generation", path=folder))
    store = handler.prefix_store = PrefixStore()
    store.set_limit(2**40)
    handler.load(CpuDevice())
    loop = asyncio.new_event_loop()
    base = " ".join(f"alpha{i}" for i in range(30))
    longer = base + " " + " ".join(f"beta{i}" for i in range(30))
    base_tokens = len(handler.encode(base))
    streams: dict[str, TokenStream] = {}
    results: dict[str, DecodeResult] = {}

    def ask(name: str, prompt: str, tokens: int) -> threading.Thread:
        params = SamplingParams(max_tokens=tokens, temperature=0.0)
        prepared = handler.prepare_generation(prompt, params, tokens)
        stream = streams[name] = TokenStream(loop)

        def run() -> None:
            results[name] = handler.generate(prepared, stream)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    try:
        ask("first", base, 2).join(60)  # kept: the store holds `base` and its answer
        running = ask("running", longer, 400)  # copies `base` from the store: a hit
        until = time.monotonic() + 60
        while handler.batch_rows < 1:
            assert time.monotonic() < until
            time.sleep(0.001)
        ask("joiner", longer + " gamma", 2).join(60)  # copies the running row's prompt
        streams["running"].cancel()
        running.join(60)
    finally:
        loop.close()
        handler.unload()
    joiner = results["joiner"]
    assert joiner.cached_tokens > base_tokens  # the running row's, not the store's
    view = store.view()
    assert view["hits"] == 1, view
    assert view["tokens_reused"] == results["running"].cached_tokens, view
