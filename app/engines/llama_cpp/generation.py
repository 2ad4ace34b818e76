"""Text generation on llama.cpp's engine (a GGUF model in a runner process: see
app.engines.llama_cpp.runner_model): `/apply-template` and `/tokenize` on the runner before a
request is queued (so its token count is exact), `/completion` with those token ids to
generate, streamed on the event loop: the runner does the work, so nothing of it waits
for our CPU pool or device threads (app.models.stages)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from typing import Any

from app.config.settings import ModelSpec
from app.engines.gguf_facts import GgufFacts, read_gguf_facts
from app.engines.llama_cpp.client import RunnerAnswer, RunnerClient
from app.engines.llama_cpp.draft_meter import DraftMeter, DraftSample, Verdict
from app.engines.llama_cpp.kv_pool import KvPool
from app.engines.llama_cpp.layer_split import LayerSplit
from app.engines.llama_cpp.load.plan import LoadSettings
from app.engines.llama_cpp.requests import completion_body, decode_result, drafts_of, logprobs_of
from app.engines.llama_cpp.runner_model import LlamaRunnerModel
from app.engines.llama_cpp.slots import TAG_FIELD
from app.engines.llama_cpp.speculation import (
    DRAFT_MODEL_KIND,
    Speculation,
    draft_gpu_layers,
    plan_speculation,
)
from app.engines.llama_cpp.watch import RunnerWatch
from app.errors import InvalidRequest, RunnerStopped
from app.models.card import ModelCard
from app.models.chat.reasoning import Frame, ThinkingAsk, answer_frame, template_switches
from app.models.decoding import (
    Chat,
    DecodeResult,
    GenerationInput,
    Prompt,
    SamplingParams,
    TokenLogprob,
    TokenStream,
    generation_prepared,
)
from app.models.kinds import Generator
from app.models.prepared import Prepared
from app.models.stages import Launched, Pools, elsewhere
from app.models.tools import chat_messages, template_knows_tools
from app.sched.budget import Geometry

log = logging.getLogger("vramgate.llama_cpp")


class LlamaCppHandler(LlamaRunnerModel, Generator):
    """Text generation on a runner: tokenised by it before queueing, streamed from it.

    Its runner speculates (app.engines.llama_cpp.speculation) unless the spec says
    `speculative = false` or its measurements said it does not pay
    (app.engines.llama_cpp.draft_meter): llama.cpp of xllamacpp 2026.10 takes no
    speculative field per request (its `speculative.*` fields are compiled out; tried:
    ignored), so a verdict against it holds from the runner's next load on. A draft
    model its config names drafts in the same runner; one llama.cpp cannot pair with it
    (another vocabulary) fails the load (`DraftRefused`), as llama.cpp alone would serve
    on without drafts, its memory taken for nothing."""

    kind = "generation"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.chat_template: str | None = None
        self.meter = DraftMeter()  # what its speculation gave, across its runners
        self.speculating: Speculation | None = None  # its running runner's, once loaded
        self.turned_off: Verdict | None = None  # measured not to pay: off from the next load
        self._draft_facts: GgufFacts | None = None  # its draft model's header, once read

    def planned_speculation(self) -> Speculation | None:
        """How its next runner speculates (None: it does not)."""
        return None if self.turned_off is not None else plan_speculation(self.spec)

    def runner_settings(self) -> dict[str, Any]:
        plan = self.planned_speculation()
        return {"speculative": plan.runner_settings()} if plan is not None else {}

    def load_settings(self) -> LoadSettings:
        """Its spec's, and what its planned speculation costs (its drafts' logits in the
        compute and output buffers, its n-gram pool or its draft model): counted before
        it loads."""
        plan = self.planned_speculation()
        settings = super().load_settings()
        if plan is None:
            return settings
        return replace(settings, **plan.load_fields(), draft=self.draft_facts(plan))

    def draft_facts(self, plan: Speculation) -> GgufFacts | None:
        """Its draft model's header (None: it drafts without one)."""
        if plan.kind != DRAFT_MODEL_KIND:
            return None
        if plan.model is None:  # a name the server's settings did not find among its models
            raise DraftRefused(f"model {self.name!r}: its draft {self.spec.draft!r} is not served")
        if self._draft_facts is None:
            try:
                self._draft_facts = read_gguf_facts(plan.model)
            except (OSError, ValueError) as exc:
                raise DraftRefused(
                    f"model {self.name!r}: its draft model {plan.model} cannot be read: {exc}"
                ) from exc
        return self._draft_facts

    def runner_config(self, pool: KvPool, split: LayerSplit) -> dict[str, Any]:
        """A draft model's layers go where the model's do (`draft_gpu_layers`)."""
        config = super().runner_config(pool, split)
        plan = self.planned_speculation()
        draft = self.draft_facts(plan) if plan is not None else None
        if draft is not None:
            layers = draft_gpu_layers(draft, split)
            config["speculative"] = {**config["speculative"], "gpu_layers": layers}
        return config

    def _load_config(self, cells: int, layers: int) -> str:
        """A load with a draft model measures more than one without: learned apart."""
        plan = self.planned_speculation()
        where = super()._load_config(cells, layers)
        return f"{where}d{plan.model.name}" if plan is not None and plan.model else where

    def loaded(self, props: dict[str, Any]) -> None:
        self.chat_template = props.get("chat_template") or self.facts().chat_template
        self.speculating = plan = self.planned_speculation()
        failed = self.footprint().speculation_failed
        if plan is not None and plan.model is not None and failed is not None:
            raise DraftRefused(
                f"model {self.name!r}: llama.cpp cannot draft for it with the draft model "
                f"{plan.paired}: {failed} (a draft model needs the model's own vocabulary)"
            )
        if plan is not None:
            log.info("model %s: speculative decoding, %s", self.name, plan.describe())

    async def encode(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids, as the runner's own template and tokenizer make them."""
        return (await self._encoded(prompt))[0]

    async def _encoded(self, prompt: Prompt) -> tuple[list[int], Frame | None]:
        """The prompt's token ids, and how a chat's answer thinks (its frame)."""
        frame = None
        if isinstance(prompt, Chat):
            rendered = await self.render(prompt)
            budget = self.spec.thinking_budget
            text, frame = answer_frame(self.chat_template, rendered, prompt.thinking, budget)
            special = {"add_special": False, "parse_special": True}
        else:
            text, special = prompt, {"add_special": True, "parse_special": False}
        found = await self._call("/tokenize", {"content": text, **special})
        return [int(t) for t in found["tokens"]], frame

    async def render(self, chat: Chat) -> str:
        """The chat as the runner's template renders it (llama.cpp's own jinja), its
        tools and its thinking switches (`chat_template_kwargs`) given to the template."""
        knows = template_knows_tools(self.chat_template)
        body: dict[str, Any] = {"messages": chat_messages(chat.messages, chat.tools, knows)}
        if knows and chat.tools:
            body["tools"] = chat.tools
        if switches := template_switches(self.chat_template, chat.thinking):
            body["chat_template_kwargs"] = switches
        return str((await self._call("/apply-template", body))["prompt"])

    async def prepare_prompt(
        self, prompt: Prompt, params: SamplingParams, default_max_tokens: int, pools: Pools
    ) -> Prepared:
        """Tokenised by the runner, on the loop: preparing is waiting, not work for the
        CPU pool."""
        if isinstance(prompt, Chat) and not self.chat_template:
            raise InvalidRequest(
                f"model {self.name!r} has no chat template; use /v1/completions", param="model"
            )
        if isinstance(prompt, Chat) and params.json_schema is not None:
            prompt = replace(prompt, thinking=ThinkingAsk(on=False))  # the grammar's, whole
        ids, frame = await self._encoded(prompt)
        return generation_prepared(
            self.name, ids, params, self.context, default_max_tokens, params.json_schema, frame
        )

    def start(self, prepared: Prepared, stream: TokenStream | None, pools: Pools) -> Launched:
        """Its tokens are read on the event loop: no thread hop per token, whose CPU a
        runner sharing a small machine's cores would lose."""
        assert stream is not None, "a generation streams"
        return asyncio.ensure_future(elsewhere(self._generate(prepared, stream)))

    async def _generate(self, prepared: Prepared, stream: TokenStream) -> DecodeResult:
        """Stream one completion from the runner, each piece of text to the stream. A
        stream our side ends early returns once the runner has let go of its slot
        (app.engines.llama_cpp.watch): only then do its cells come back to the gate."""
        task: GenerationInput = prepared.payload
        client, watch = self._client, self._watch
        if client is None or watch is None:
            raise RunnerStopped(f"model {self.name!r} is not loaded; retry", retry_after=1)
        tag = next(watch.tags)
        body = {**completion_body(task, self.spec.prefix_cache), TAG_FIELD: tag}
        self.open_cells[tag] = self.cells_for(prepared)
        streams = len(self.open_cells)  # the requests its steps are shared with, itself too
        try:
            thinking = task.thinking
            if thinking is not None and thinking.opened and thinking.budget is not None:
                read = await self._read_thinking_first(client, watch, body, stream, task)
            else:
                read = await self._read(client, watch, body, stream)
            final, text, logprobs = read
            if not final and stream.cancelled.is_set():
                await self._let_go(watch, tag)
        finally:
            streams = max(streams, len(self.open_cells))
            del self.open_cells[tag]
        if not final and not stream.cancelled.is_set():
            raise self._stopped(RuntimeError("the stream ended early"))
        result = decode_result(final, text, logprobs, prepared, self.speculating is not None)
        if self.prefix_store is not None and task.params.prefix_cache:
            self.prefix_store.record(result.cached_tokens)  # its hits in /status
        self._measure_drafts(final, streams)
        return result

    def _measure_drafts(self, final: dict[str, Any], streams: int) -> None:
        """A finished request's drafts into the meter; speculation that the meter finds
        not to pay, with as many streams as its requests run beside, is turned off from
        the runner's next load (said once, in the log and in /status)."""
        drafts = drafts_of(final, speculating=True)
        if drafts is None or self.speculating is None:
            return
        sample = DraftSample(
            streams, drafts.tokens, drafts.drafted, drafts.accepted, drafts.decode_ms / 1000
        )
        self.meter.record(sample)
        if self.turned_off is not None:
            return
        verdict = self.meter.verdict(self.meter.typical_streams())
        if not verdict.pays:
            self.turned_off = verdict
            log.warning(
                "model %s: speculative decoding does not pay: %s; off from its next load",
                self.name,
                verdict.why,
            )

    async def _read_thinking_first(
        self,
        client: RunnerClient,
        watch: RunnerWatch,
        body: dict[str, Any],
        stream: TokenStream,
        task: GenerationInput,
    ) -> tuple[dict[str, Any], list[str], list[TokenLogprob]]:
        """An answer whose prompt opened its thinking (an R1 distill's), on a budget: the
        thinking first, up to the budget's tokens, then the answer after it, its close tag
        written where the thinking did not close itself. llama.cpp's budget sampler counts
        only from an open tag it sees generated (a prompt's tag reaches it under a grammar
        of its own only: xllamacpp 2026.10, tried), so here `n_predict` bounds it."""
        frame = task.thinking
        assert frame is not None and frame.budget is not None
        budget = min(frame.budget, task.max_tokens)
        first = {**body, "n_predict": budget, "return_tokens": True}
        ids: list[int] = []
        final: dict[str, Any] = {"stop_type": "limit"}  # a budget of 0: closed at once
        text: list[str] = []
        logprobs: list[TokenLogprob] = []
        if budget > 0:
            final, text, logprobs = await self._read(client, watch, first, stream, ids)
        if final.get("stop_type") != "limit" or budget >= task.max_tokens:
            return final, text, logprobs  # it ended, stopped or used all its tokens
        if frame.close not in "".join(text):
            close = {"content": frame.close, "add_special": False, "parse_special": True}
            ids += [int(t) for t in (await self._call("/tokenize", close))["tokens"]]
            text.append(frame.close)
            stream.push(frame.close)
        rest = {**first, "prompt": [*body["prompt"], *ids], "n_predict": task.max_tokens - len(ids)}
        rest.pop("return_tokens")
        final, more, more_logprobs = await self._read(client, watch, rest, stream)
        if final:
            final = {**final, "tokens_predicted": int(final.get("tokens_predicted", 0)) + len(ids)}
        return final, text + more, logprobs + more_logprobs

    async def _read(
        self,
        client: RunnerClient,
        watch: RunnerWatch,
        body: dict[str, Any],
        stream: TokenStream,
        ids: list[int] | None = None,
    ) -> tuple[dict[str, Any], list[str], list[TokenLogprob]]:
        """The completion's events until its last (`final`: empty if the stream was
        cancelled or ended early); its connection is closed when this returns. `ids`
        gets the tokens it generated (with `return_tokens` in `body`)."""
        text: list[str] = []
        logprobs: list[TokenLogprob] = []
        try:
            events = client.events("/completion", body, look=watch.look)
            async with contextlib.aclosing(events) as chunks:
                async for chunk in chunks:
                    if stream.cancelled.is_set():
                        break  # the connection closes now: llama.cpp cancels the task
                    if "error" in chunk:
                        raise self._answered(_error_status(chunk["error"]), chunk["error"])
                    # the runner's beat, for every run of it: a request whose prompt waits
                    # behind another's long prefill hears nothing of its own meanwhile
                    self.progress_at = time.monotonic()
                    if "prompt_progress" in chunk and not chunk.get("content"):
                        stream.beat()  # its prefill goes on: alive, with nothing to say yet
                        continue
                    self.forward_calls += 1
                    piece = str(chunk.get("content", ""))
                    if ids is not None:
                        ids.extend(int(t) for t in chunk.get("tokens") or ())
                    text.append(piece)
                    logprobs.extend(logprobs_of(chunk))
                    stream.push(piece)
                    if chunk.get("stop"):
                        return chunk, text, logprobs
        except RunnerAnswer as answer:
            raise self._answered(answer.status, str(answer)) from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            # a runner that broke the stream and lives on may still hold its slot; one
            # that died is given a moment to be seen so (its exit code then says why)
            for _ in range(10):
                if self.exited() is not None:
                    break
                await asyncio.sleep(0.05)
            else:
                self.end_runner(f"broke a stream ({exc!r})")
            raise self._stopped(exc) from exc
        return {}, text, logprobs

    async def _let_go(self, watch: RunnerWatch, tag: int) -> None:
        """Hold a cancelled request's cells until the runner has let go of its slot; a
        runner that does not (or stops answering) is ended, which frees them all. The
        watch is the one the request began with: an unload that ended the stream has
        dropped the model's own (and a stopped runner answers no look)."""
        took = await watch.let_go(tag)
        if took is not None:
            log.debug(
                "model %s: the runner let go of a cancelled request in %.2fs", self.name, took
            )
            return
        self.end_runner(f"did not let go of a cancelled request within {self.run_timeout:g}s")

    def held_bytes(self, prepared: Prepared) -> int:
        """Its cells' bytes: what it holds of the runner's KV pool."""
        per_token = self.facts().kv_bytes_per_token(self.spec.kv_cache_type)
        return self.cells_for(prepared) * per_token

    def geometry(self, prompt_tokens: int) -> Geometry:
        """A request costs no device bytes beyond the runner's: its KV cells were
        reserved at load, and it waits for a slot (`cell_capacity`)."""
        return Geometry(0, 0)

    def card(self) -> ModelCard:
        card = super().card()
        return replace(card, chat_template=self.chat_template or self.facts().chat_template)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "speculative": self.speculative_view()}

    def speculative_view(self) -> dict[str, Any]:
        """Its speculation in /status: whether it is on (its runner's; unloaded, its next
        load's), the kind and sizes, whether it pays and why, and what it measured."""
        plan = self.speculating if self.pool is not None else self.planned_speculation()
        verdict = self.turned_off or self.meter.verdict(self.meter.typical_streams())
        if not self.spec.speculative:
            verdict = Verdict(False, "speculative = false")
        return {
            "on": plan is not None,
            **(plan.runner_settings() if plan is not None else {"kind": None}),
            "draft_model": plan.paired if plan is not None else None,  # which, and why
            "pays": verdict.pays,
            "why": verdict.why,
            "off_from_next_load": plan is not None and self.turned_off is not None,
            **self.meter.describe(),
        }


class DraftRefused(RuntimeError):
    """A draft model its model cannot load with: not served, unreadable, or refused by
    llama.cpp (another vocabulary)."""


def _error_status(error: Any) -> int:
    """The status of an error event mid-stream, which llama.cpp sends as
    `{"error": {"code": 500, "message": "Context size has been exceeded.", "type":
    "server_error"}}` (as xllamacpp 2026.10.11549 sent it here,
    tests/engines/llama_cpp/test_runner_failures.py); 500 where it names none."""
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, int) else 500
