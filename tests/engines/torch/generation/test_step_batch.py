"""Step-level batching on a real (small, randomly initialised) Llama, saved and loaded with
transformers' own code; the handler runs on the CPU device, without HTTP or a server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from app.config.settings import ModelSpec
from app.devices.cpu import CpuDevice
from app.engines.torch.generation import packing
from app.engines.torch.generation.causal_lm import CausalLMHandler
from app.engines.torch.generation.forward_cost import ForwardCost
from app.engines.torch.generation.step_batch import StepBatcher
from app.models.decoding import DecodeResult, SamplingParams, TokenStream
from tests.support.random_models import save_random_llama

PROMPTS = [f"prompt number {i}: the quick brown fox jumps over {i} lazy dogs" for i in range(16)]


@pytest.fixture(scope="module")
def handler(tmp_path_factory) -> Iterator[CausalLMHandler]:
    folder = save_random_llama(tmp_path_factory.mktemp("tiny-llama"), context=1024)
    spec = ModelSpec(name="tiny", kind="generation", path=folder, dtype="float32")
    handler = CausalLMHandler(spec)
    handler.load(CpuDevice())
    yield handler
    handler.unload()


class Streams:
    """Generations run as the executor runs them: each on a thread of its own, waiting."""

    def __init__(self, handler: CausalLMHandler) -> None:
        self.handler = handler
        self.loop = asyncio.new_event_loop()  # never run: deltas queue up unread
        self.results: dict[str, DecodeResult] = {}
        self.threads: dict[str, threading.Thread] = {}
        self.streams: dict[str, TokenStream] = {}

    def start(self, name: str, prompt: str, tokens: int, **params: object) -> None:
        fields: dict[str, object] = {"max_tokens": tokens, "temperature": 0.0, **params}
        sampling = SamplingParams(**fields)  # type: ignore[arg-type]
        prepared = self.handler.prepare_generation(prompt, sampling, tokens)
        stream = self.streams[name] = TokenStream(self.loop)

        def run() -> None:
            self.results[name] = self.handler.generate(prepared, stream)

        thread = self.threads[name] = threading.Thread(target=run)
        thread.start()

    def wait(self, *names: str) -> dict[str, DecodeResult]:
        for name in names or list(self.threads):
            self.threads[name].join(timeout=120)
            assert not self.threads[name].is_alive(), f"{name} never ended"
        return self.results

    def close(self) -> None:
        self.loop.close()


def alone(handler: CausalLMHandler, prompt: str, tokens: int, **params: object) -> DecodeResult:
    streams = Streams(handler)
    try:
        streams.start("one", prompt, tokens, **params)
        return streams.wait()["one"]
    finally:
        streams.close()


def until(condition, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.001)


def test_eight_streams_share_one_forward_per_step(handler):
    streams = Streams(handler)
    before = handler.forward_calls
    for i in range(8):
        streams.start(f"s{i}", PROMPTS[i], 24)
    results = streams.wait()
    streams.close()
    steps = handler.forward_calls - before
    assert all(r.completion_tokens == 24 and r.finish_reason == "length" for r in results.values())
    # alone, each would take 24 forwards (192 in all); batched, about 24 plus the prefills
    # of the streams that arrived while others ran, or twice 24 where the last arrived
    # too late to join the first batch's padding (on a loaded machine)
    assert steps <= 2 * 24 + 8, steps
    assert max(r.steps for r in results.values()) <= 24 + 1


def test_a_stream_that_arrives_mid_way_joins_and_ends_before_the_first(handler):
    streams = Streams(handler)
    before = handler.forward_calls
    streams.start("long", PROMPTS[0], 400)
    until(lambda: handler.forward_calls - before >= 20, "the long stream runs")
    streams.start("short", PROMPTS[1], 8)
    streams.wait("short")
    assert streams.threads["long"].is_alive(), "the short stream waited for the long one"
    streams.streams["long"].cancel()
    results = streams.wait()
    streams.close()
    assert results["short"].completion_tokens == 8
    assert results["long"].finish_reason == "cancelled"


def test_a_cancelled_row_leaves_at_the_next_step_and_the_others_go_on(handler):
    lone = {name: alone(handler, PROMPTS[i], 160) for i, name in ((2, "a"), (4, "c"))}
    streams = Streams(handler)
    for name, i in (("a", 2), ("b", 3), ("c", 4)):
        streams.start(name, PROMPTS[i], 160)
    until(lambda: handler.batch_rows == 3, "three rows in the batch")
    streams.streams["b"].cancel()
    until(lambda: handler.batch_rows == 2, "the cancelled row left")
    results = streams.wait()
    streams.close()
    assert results["b"].finish_reason == "cancelled" and results["b"].completion_tokens < 160
    # the row's KV bytes are what it held: its tokens × one token's bytes
    per_token = results["a"].kv_bytes // results["a"].kv_tokens
    assert results["b"].kv_bytes == per_token * results["b"].kv_tokens
    for name in ("a", "c"):
        assert results[name].completion_tokens == 160
        assert results[name].text == lone[name].text, name


def test_seeded_sampling_gives_the_same_text_alone_and_in_a_batch(handler):
    params = {"temperature": 0.9, "top_p": 0.95, "seed": 1234}
    by_itself = alone(handler, PROMPTS[5], 32, **params)
    streams = Streams(handler)
    for i in range(6):
        streams.start(f"s{i}", PROMPTS[5 + i], 32, **params)
    results = streams.wait()
    streams.close()
    assert results["s0"].text == by_itself.text


def test_greedy_texts_alone_and_eight_at_once_agree(handler, capsys):
    """The figure docs/admission.md states: greedy answers of 16 prompts, each alone, then in
    batches of 8 at once."""
    lone = [alone(handler, prompt, 32).text for prompt in PROMPTS]
    batched: list[str] = []
    for start in (0, 8):
        streams = Streams(handler)
        for i in range(start, start + 8):
            streams.start(f"s{i}", PROMPTS[i], 32)
        results = streams.wait()
        streams.close()
        batched += [results[f"s{i}"].text for i in range(start, start + 8)]
    same = sum(a == b for a, b in zip(lone, batched, strict=True))
    with capsys.disabled():
        print(f"\ngreedy agreement, alone vs 8 at once: {same}/{len(PROMPTS)}")
    assert same >= len(PROMPTS) - 2  # rare near-ties may flip (kernels differ by batch)


def test_a_long_prompt_is_prefilled_in_chunks_while_the_batch_steps(handler, monkeypatch):
    from app.engines.torch.generation import step_batch

    monkeypatch.setattr(step_batch, "PREFILL_CHUNK", 16)
    long_prompt = " ".join(PROMPTS)  # several chunks of 16 tokens
    lone = alone(handler, long_prompt, 8)
    streams = Streams(handler)
    streams.start("running", PROMPTS[0], 200)
    until(lambda: handler.batch_rows == 1, "the first stream runs")
    streams.start("long", long_prompt, 8)
    results = streams.wait("long")
    streams.streams["running"].cancel()
    streams.wait()
    streams.close()
    assert results["long"].text == lone.text
    assert results["long"].steps > 8  # its prefill took several forwards


def test_a_joining_row_copies_a_running_rows_prompt_prefix_and_answers_as_alone(
    handler, monkeypatch
):
    from app.engines.torch.generation import kv_cache

    copies: list[list[int]] = []
    real = kv_cache.copied_prefixes

    def spy(sources):  # the real function, its calls recorded
        copies.append([source[3] if source else 0 for source in sources])
        return real(sources)

    monkeypatch.setattr(kv_cache, "copied_prefixes", spy)
    system = "you are a helpful assistant who answers briefly and well; " * 4
    running = system + "what is the weather like today?"
    asked = [system + "tell me about foxes.", running]  # a shared prefix; the same prompt
    lone = [alone(handler, prompt, 24).text for prompt in asked]
    copies.clear()
    streams = Streams(handler)
    streams.start("running", running, 400)
    until(lambda: handler.batch_rows == 1, "the first stream runs")
    for i, prompt in enumerate(asked):
        streams.start(f"asked{i}", prompt, 24)
        streams.wait(f"asked{i}")
    streams.streams["running"].cancel()
    results = streams.wait()
    streams.close()
    assert [results[f"asked{i}"].text for i in range(2)] == lone
    shared = [count for call in copies for count in call if count]
    prompt_tokens = len(handler.encode(running))
    assert shared and min(shared) >= kv_cache.MIN_SHARED
    assert max(shared) == prompt_tokens - 1  # the same prompt: all but its last token


def test_a_short_stream_beside_a_long_one_steps_in_a_batch_of_its_own(handler):
    """Padded into the long stream's batch, the short one would hold the long one's
    length of KV, far past what it was admitted for: it gets a batch of its own."""
    lone = alone(handler, PROMPTS[7], 8).text
    streams = Streams(handler)
    streams.start("long", PROMPTS[6], 900)
    until(lambda: handler.forward_calls and handler.batch_rows == 1, "the long stream runs")
    before = handler.forward_calls
    until(lambda: handler.forward_calls - before >= 200, "the long stream is 200 tokens in")
    batcher = handler._batcher
    assert batcher is not None
    streams.start("short", PROMPTS[7], 8)
    until(lambda: batcher.batches == 2 or not streams.threads["short"].is_alive(), "joined")
    seen = batcher.batches
    results = streams.wait("short")
    streams.streams["long"].cancel()
    streams.wait()
    streams.close()
    assert seen == 2
    assert results["short"].text == lone


class PricedForwards(ForwardCost):
    """A device whose forwards cost `fixed` + `per_token` × tokens seconds, whatever the
    forwards run here measure (the fit itself is tested in test_forward_cost.py)."""

    def __init__(self, fixed: float, per_token: float) -> None:
        super().__init__()
        self.line = (fixed, per_token)

    def fit(self) -> tuple[float, float]:
        return self.line


def held_burst(
    handler: CausalLMHandler, asked: dict[str, str], **options: object
) -> tuple[dict[str, DecodeResult], list[tuple[tuple[int, ...], bool]]]:
    """`asked` pending together while an unrelated row's prefill runs, in a batcher of
    its own around the handler's model (built with `options`); the texts, and each
    forward's input shape and whether it was given a cache."""
    release = threading.Event()
    calls: list[tuple[tuple[int, ...], bool]] = []

    def forward(**inputs):  # the real model; its first forward waits for the others
        if not calls:
            release.wait(60)
        calls.append((tuple(inputs["input_ids"].shape), handler._cache_arg in inputs))
        return handler._model(**inputs)

    batcher = StepBatcher(
        forward,
        handler._decode,
        handler._eos,
        torch.device("cpu"),
        cache_arg=handler._cache_arg,
        keep_last_logits=handler._keep_last_logits,
        **options,  # type: ignore[arg-type]
    )
    loop = asyncio.new_event_loop()
    results: dict[str, DecodeResult] = {}

    def run(name: str, prompt: str) -> None:
        task = handler.prepare_generation(prompt, SamplingParams(temperature=0.0), 12).payload
        results[name] = batcher.generate(task, TokenStream(loop))

    threads = [threading.Thread(target=run, args=("unrelated", PROMPTS[9]))]
    threads[0].start()
    until(lambda: batcher._pending and calls == [], "the first prefill")
    for name, prompt in asked.items():
        threads.append(threading.Thread(target=run, args=(name, prompt)))
        threads[-1].start()
        until(lambda: len(batcher._pending) == len(threads), f"{name} pending")
    release.set()
    for thread in threads:
        thread.join(timeout=120)
    batcher.close()
    loop.close()
    return {name: results[name] for name in asked}, calls


SYSTEM = "you are a helpful assistant who answers briefly and well; " * 4
CHATS = {"a": SYSTEM + "tell me about foxes.", "b": SYSTEM + "and about owls?"}


@pytest.mark.parametrize(
    ("device", "split"),
    [(PricedForwards(0.035, 0.0015), True), (PricedForwards(0.010, 0.00001), False)],
    ids=["cpu-like-costs", "gpu-like-costs"],
)
def test_chats_sharing_a_system_prompt_that_arrive_together(handler, device, split):
    """Two chats with one system prompt are pending together while an unrelated row's
    prefill runs (packing off). Where a forward costs less than the shared tokens, the
    first is prefilled alone and the second copies its prefix a forward later; where it
    does not, both are prefilled in one forward. Either way each answers as it does alone."""
    lone = {name: alone(handler, prompt, 12).text for name, prompt in CHATS.items()}
    results, calls = held_burst(handler, CHATS, cost=device)
    assert {name: result.text for name, result in results.items()} == lone
    a, b = (len(handler.encode(prompt)) for prompt in CHATS.values())
    if split:
        assert calls[1] == ((1, a), False)  # the first chat alone, its whole prompt
        assert calls[2][0][0] == 1 and calls[2][0][1] < b - 16 and calls[2][1]  # b's suffix
    else:
        assert calls[1] == ((2, max(a, b)), False)  # both whole, in one forward


def test_chats_sharing_a_system_prompt_are_packed_into_one_forward(handler):
    """Packed: the system prompt once, then each chat's own tokens, in one forward of one
    sequence, whatever the forward costs; each answers as it does alone."""
    assert handler.describe()["packed_prefill"] is True  # the load-time check passed
    system = SYSTEM[: len(SYSTEM) // 2]  # three prompts within one group's PREFILL_TOKENS
    asked = ("tell me about foxes.", "and about owls?", "what do cats eat?")
    chats = {name: system + question for name, question in zip("abc", asked, strict=True)}
    lone = {name: alone(handler, prompt, 12).text for name, prompt in chats.items()}
    results, calls = held_burst(handler, chats, cost=PricedForwards(0.010, 0.00001), packable=True)
    assert {name: result.text for name, result in results.items()} == lone
    prompts = [handler.encode(prompt) for prompt in chats.values()]
    shared = packing.shared_prefix(prompts)
    assert shared >= 16
    tokens = shared + sum(len(p) - shared for p in prompts)
    assert calls[1] == ((1, tokens), False)  # one sequence, the prefix counted once
    assert all(result.steps == 12 for result in results.values())  # prefill + 11 steps


def test_a_model_whose_attention_ignores_packed_masks_is_not_packed(handler):
    """An attention that drops custom masks (as flash attention does) would mix the
    packed rows: the load-time check sees their logits differ from each alone."""
    model = handler._model

    def ignores_masks(**inputs):
        inputs.pop("attention_mask", None)
        return model(**inputs)

    assert packing.packing_works(model, torch.device("cpu"), torch.float32)
    assert not packing.packing_works(ignores_masks, torch.device("cpu"), torch.float32)
