"""Text generation on llama.cpp's engine (a GGUF model in a runner process: see
app.engines.llama_cpp.runner_model): `/apply-template` and `/tokenize` on the runner before a
request is queued (so its token count is exact), `/completion` with those token ids to
generate, streamed on the event loop: the runner does the work, so nothing of it waits
for our CPU pool or device threads (app.models.stages)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from app.config.settings import ModelSpec
from app.engines.llama_cpp.client import RunnerAnswer
from app.engines.llama_cpp.requests import completion_body, decode_result, logprobs_of
from app.engines.llama_cpp.runner_model import LlamaRunnerModel
from app.errors import InvalidRequest, RunnerStopped
from app.models.card import ModelCard
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
    """Text generation on a runner: tokenised by it before queueing, streamed from it."""

    kind = "generation"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.chat_template: str | None = None

    def loaded(self, props: dict[str, Any]) -> None:
        self.chat_template = props.get("chat_template") or self.facts().chat_template

    async def encode(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids, as the runner's own template and tokenizer make them."""
        if isinstance(prompt, Chat):
            knows = template_knows_tools(self.chat_template)
            body: dict[str, Any] = {"messages": chat_messages(prompt.messages, prompt.tools, knows)}
            if knows and prompt.tools:
                body["tools"] = prompt.tools
            text = (await self._call("/apply-template", body))["prompt"]
            special = {"add_special": False, "parse_special": True}
        else:
            text, special = prompt, {"add_special": True, "parse_special": False}
        found = await self._call("/tokenize", {"content": text, **special})
        return [int(t) for t in found["tokens"]]

    async def prepare_prompt(
        self, prompt: Prompt, params: SamplingParams, default_max_tokens: int, pools: Pools
    ) -> Prepared:
        """Tokenised by the runner, on the loop: preparing is waiting, not work for the
        CPU pool."""
        if isinstance(prompt, Chat) and not self.chat_template:
            raise InvalidRequest(
                f"model {self.name!r} has no chat template; use /v1/completions", param="model"
            )
        ids = await self.encode(prompt)
        return generation_prepared(
            self.name, ids, params, self.context, default_max_tokens, params.json_schema
        )

    def start(self, prepared: Prepared, stream: TokenStream | None, pools: Pools) -> Launched:
        """Its tokens are read on the event loop: no thread hop per token, whose CPU a
        runner sharing a small machine's cores would lose."""
        assert stream is not None, "a generation streams"
        return asyncio.ensure_future(elsewhere(self._generate(prepared, stream)))

    async def _generate(self, prepared: Prepared, stream: TokenStream) -> DecodeResult:
        """Stream one completion from the runner, each piece of text to the stream."""
        task: GenerationInput = prepared.payload
        client = self._client
        if client is None:
            raise RunnerStopped(f"model {self.name!r} is not loaded; retry", retry_after=1)
        text: list[str] = []
        logprobs: list[TokenLogprob] = []
        final: dict[str, Any] = {}
        try:
            body = completion_body(task, self.spec.prefix_cache)
            async for chunk in client.events("/completion", body, alive=self._vouched(stream)):
                if stream.cancelled.is_set():
                    break  # closing the connection cancels the task in llama.cpp
                if "error" in chunk:
                    raise InvalidRequest(f"model {self.name!r}: {chunk['error']}")
                # the runner's beat, for every run of it: a request whose prompt waits
                # behind another's long prefill hears nothing of its own meanwhile
                self.progress_at = time.monotonic()
                if "prompt_progress" in chunk and not chunk.get("content"):
                    stream.beat()  # its prefill goes on: alive, with nothing to say yet
                    continue
                self.forward_calls += 1
                piece = str(chunk.get("content", ""))
                text.append(piece)
                logprobs.extend(logprobs_of(chunk))
                stream.push(piece)
                if chunk.get("stop"):
                    final = chunk
                    break
        except RunnerAnswer as answer:
            raise InvalidRequest(f"model {self.name!r}: {answer}") from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            raise self._stopped(exc) from exc
        if not final and not stream.cancelled.is_set():
            raise self._stopped(RuntimeError("the stream ended early"))
        result = decode_result(final, text, logprobs, prepared)
        if self.prefix_store is not None and task.params.prefix_cache:
            self.prefix_store.record(result.cached_tokens)  # its hits in /status
        return result

    def _vouched(self, stream: TokenStream) -> Callable[[], None]:
        """A silent stream whose runner answers its /health: alive, computing."""

        def alive() -> None:
            self.progress_at = time.monotonic()
            stream.beat()

        return alive

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
