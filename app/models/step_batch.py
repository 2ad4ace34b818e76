"""Step-level batching of text generation: every decode step runs all active streams of a
model as one forward.

One thread per model owns the batch; a stream's caller (an executor stream thread) hands
its row in and waits. New rows are prefilled (short prompts together, a long one alone in
chunks, so running rows wait at most one chunk) and join at the next step boundary: KV
caches left-padded to one length and concatenated, a mask hiding the padding, position ids
counting each row's own tokens (TGI's `CausalLMBatch.concatenate`). A row that ends (end of
sequence, stop string, `max_tokens`, client gone) leaves at the next boundary and columns
no row uses are cut. Each row samples with its own parameters and seeded generator, so its
text does not depend on who shares its batch (up to kernel rounding: see the README).
Admission stays the gate's: a row exists only once its KV bytes were admitted, and there
are at most `max_streams`. A cache that is not plain dynamic (sliding-window layers) runs
its rows one after another.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from app.models.decoding import (
    DecodeResult,
    GenerationInput,
    SamplingParams,
    StopScanner,
    TokenStream,
)
from app.models.kv_cache import copied_prefixes, find_donor, stack, suffix_inputs

log = logging.getLogger("vramgate.generation")

PREFILL_CHUNK = 256  # a long prompt is prefilled this many tokens per step
PREFILL_TOKENS = 512  # short prompts prefilled together: at most this many (padded) tokens


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Greedy at temperature 0; otherwise temperature, then nucleus (top_p) sampling."""
    logits = logits.float().cpu()
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        ordered, index = torch.sort(probs, descending=True)
        keep = torch.cumsum(ordered, dim=-1) - ordered < params.top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter(0, index[keep], ordered[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


@dataclass(eq=False)
class Row:
    """One stream in the batch."""

    task: GenerationInput
    stream: TokenStream
    sampler: torch.Generator
    scanner: StopScanner
    produced: list[int] = field(default_factory=list)
    steps: int = 0  # forwards that computed this row (prefill chunks included)
    position: int = 0  # tokens in its cache: the prompt and the tokens fed back
    next_token: int = 0  # sampled, to be fed at the next step
    cache: Any = None  # its own cache while a long prompt is prefilled in chunks
    finish: str | None = None
    result: DecodeResult | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class StepBatcher:
    def __init__(
        self,
        forward: Callable[..., Any],
        decode: Callable[[list[int]], str],
        eos: set[int],
        device: torch.device,
        *,
        cache_arg: str = "past_key_values",
        keep_last_logits: bool = True,
        joinable: bool = True,
        job_stream: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
        on_forward: Callable[[], None] = lambda: None,
        name: str = "model",
    ) -> None:
        """`forward` is the model; `decode` token ids to text; `on_forward` counts steps."""
        self._forward = forward
        self._decode = decode
        self._eos = eos
        self._device = device
        self._cache_arg = cache_arg
        self._extra: dict[str, Any] = {"logits_to_keep": 1} if keep_last_logits else {}
        self._job_stream = job_stream
        self._on_forward = on_forward
        self._cond = threading.Condition()
        self._pending: deque[Row] = deque()  # handed in, not yet prefilled (guarded)
        self._closed = False
        self.joinable = joinable  # False: rows run one after another
        # the batch: owned by the batch thread alone
        self._rows: list[Row] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None  # [rows, cache tokens]: 1 real, 0 padding
        self._thread = threading.Thread(target=self._loop, name=f"vramgate-batch-{name}")
        self._thread.daemon = True
        self._thread.start()

    # -- the callers' side ---------------------------------------------------------------
    def generate(self, task: GenerationInput, stream: TokenStream) -> DecodeResult:
        """Run one stream in the batch; returns when it ended (on the caller's thread)."""
        sampler = torch.Generator()
        if task.params.seed is not None:
            sampler.manual_seed(task.params.seed)
        else:
            sampler.seed()
        row = Row(task, stream, sampler, StopScanner(task.params.stop))
        with self._cond:
            if self._closed:
                raise RuntimeError("the model is unloaded")
            self._pending.append(row)
            self._cond.notify()
        row.done.wait()
        if row.error is not None:
            raise row.error
        assert row.result is not None
        return row.result

    @property
    def rows(self) -> int:  # streams in the running batch (read for tests and /status)
        return len(self._rows)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=30)

    # -- the batch thread ----------------------------------------------------------------
    def _loop(self) -> None:
        with self._job_stream():
            while True:
                with self._cond:
                    while not self._pending and not self._rows and not self._closed:
                        self._cond.wait()
                    if self._closed and not self._rows:
                        failed = list(self._pending)
                        self._pending.clear()
                        break
                    joiners = self._take_joiners()
                try:
                    spent = 0  # prefills before the next step: at most one chunk's worth
                    while joiners:
                        spent += self._prefill(joiners)
                        with self._cond:
                            joiners = self._take_joiners() if spent < PREFILL_CHUNK else []
                    if self._rows:
                        self._step()
                except Exception as exc:  # the forward failed: every row in it fails
                    self._fail([*joiners, *self._rows], exc)
        for row in failed:
            self._end(row, error=RuntimeError("the model is unloaded"))

    def _take_joiners(self) -> list[Row]:
        """Rows to prefill now (under the lock): short prompts together, up to
        PREFILL_TOKENS padded tokens, or the first long one alone (one chunk a step)."""
        if not self.joinable and self._rows:
            return []  # one row at a time
        taken: list[Row] = []
        longest = 0
        for row in list(self._pending):
            if row.stream.cancelled.is_set():
                self._pending.remove(row)
                row.cache = None  # a long prompt's partial prefill
                self._end(row, finish="cancelled")
                continue
            remaining = len(row.task.prompt_ids) - row.position
            if remaining > PREFILL_CHUNK or row.cache is not None:
                if not taken:
                    taken.append(row)  # prefilled alone, in chunks
                break
            longest = max(longest, remaining)
            if taken and (len(taken) + 1) * longest > PREFILL_TOKENS:
                break
            taken.append(row)
            if not self.joinable:
                break
        for row in taken:
            row.stream.emit("")  # alive: its prefill comes now
        return taken

    def _prefill(self, rows: list[Row]) -> int:
        """Prefill `rows` (one forward); returns the tokens it computed."""
        if len(rows) == 1 and (
            rows[0].cache is not None or len(rows[0].task.prompt_ids) > PREFILL_CHUNK
        ):
            return self._prefill_chunk(rows[0])
        ids = [row.task.prompt_ids for row in rows]
        running = [row.task.prompt_ids for row in self._rows]
        donors = [find_donor(prompt, running) for prompt in ids]
        copied = None
        if any(count for _, count in donors):
            assert self._mask is not None
            copied = copied_prefixes(self._cache, self._mask, donors)
        if copied is not None:  # only what follows each row's copied prefix is computed
            prefix, prefix_mask = copied
            input_ids, mask, positions = suffix_inputs(ids, [count for _, count in donors])
            mask = torch.cat([prefix_mask, mask], dim=1)
            out = self._run(input_ids, mask, positions, prefix)
        else:
            length = max(len(p) for p in ids)
            input_ids = torch.tensor([[0] * (length - len(p)) + p for p in ids])
            mask = torch.tensor([[0] * (length - len(p)) + [1] * len(p) for p in ids])
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = self._run(input_ids, mask, positions, None)
        cache = getattr(out, self._cache_arg)
        with self._cond:
            for row in rows:
                self._pending.remove(row)
        for row in rows:
            row.position = len(row.task.prompt_ids)
            row.steps += 1
        self._admit(rows, cache, mask, out.logits[:, -1])
        return int(input_ids.numel())

    def _prefill_chunk(self, row: Row) -> int:
        """One chunk of a long prompt, in the row's own cache."""
        prompt = row.task.prompt_ids
        chunk = prompt[row.position : row.position + PREFILL_CHUNK]
        start, end = row.position, row.position + len(chunk)
        input_ids = torch.tensor([chunk])
        mask = torch.ones((1, end), dtype=torch.long)
        positions = torch.arange(start, end).unsqueeze(0)
        out = self._run(input_ids, mask, positions, row.cache)
        row.cache = getattr(out, self._cache_arg)
        row.position, row.steps = end, row.steps + 1
        row.stream.emit("")
        if end < len(prompt):
            return len(chunk)
        with self._cond:
            self._pending.remove(row)
        cache, row.cache = row.cache, None
        self._admit([row], cache, mask, out.logits[:, -1])
        return len(chunk)

    def _step(self) -> None:
        """One decode step of every row in the batch."""
        for row in self._rows:
            if row.stream.cancelled.is_set():
                row.finish = "cancelled"
        self._drop_finished()
        if not self._rows:
            return
        assert self._mask is not None
        input_ids = torch.tensor([[row.next_token] for row in self._rows])
        mask = torch.cat([self._mask, self._mask.new_ones((len(self._rows), 1))], dim=1)
        positions = torch.tensor([[row.position] for row in self._rows])
        out = self._run(input_ids, mask, positions, self._cache)
        self._cache, self._mask = getattr(out, self._cache_arg), mask
        for index, row in enumerate(self._rows):
            row.position += 1
            row.steps += 1
            self._advance(row, sample(out.logits[index, -1], row.task.params, row.sampler))
        self._drop_finished()

    def _run(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> Any:
        kwargs = dict(self._extra)
        if cache is not None:
            kwargs[self._cache_arg] = cache
        device = self._device
        with torch.inference_mode():
            out = self._forward(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                use_cache=True,
                **kwargs,
            )
        self._on_forward()
        return out

    # -- rows joining, advancing and leaving ---------------------------------------------
    def _admit(self, rows: list[Row], cache: Any, mask: torch.Tensor, logits: torch.Tensor) -> None:
        """Freshly prefilled rows: sample their first tokens, join the batch."""
        for index, row in enumerate(rows):
            self._advance(row, sample(logits[index], row.task.params, row.sampler))
        if self._rows:
            self._join(cache, mask)
        else:
            self._cache, self._mask = cache, mask.to(torch.long)
        self._rows.extend(rows)
        self._drop_finished()

    def _join(self, cache: Any, mask: torch.Tensor) -> None:
        """Concatenate `cache` (rows just prefilled) under the batch's, both left-padded
        to the longer of the two."""
        assert self._mask is not None
        length = max(self._mask.shape[1], mask.shape[1])
        for mine, theirs in zip(self._cache.layers, cache.layers, strict=True):
            mine.keys = stack(mine.keys, theirs.keys, length, 2)
            mine.values = stack(mine.values, theirs.values, length, 2)
        self._mask = stack(self._mask, mask.to(torch.long), length, 1)

    def _advance(self, row: Row, token: int) -> None:
        """A row's new token: end of sequence, a stop string, or text to send."""
        if token in self._eos:
            row.finish = "stop"
            return
        row.produced.append(token)
        row.stream.emit(row.scanner.push(self._decode(row.produced)))
        if row.scanner.stopped:
            row.finish = "stop"
        elif len(row.produced) >= row.task.max_tokens:
            row.finish = "length"
        else:
            row.next_token = token

    def _drop_finished(self) -> None:
        """Rows that ended leave the batch; columns only they used are cut."""
        keep = [i for i, row in enumerate(self._rows) if row.finish is None]
        if len(keep) == len(self._rows):
            return
        per_token = self._bytes_per_token()
        for row in self._rows:
            if row.finish is not None:
                self._end(row, finish=row.finish, kv_bytes=per_token * row.position)
        self._rows = [self._rows[i] for i in keep]
        if not self._rows:
            self._cache = self._mask = None
            return
        assert self._mask is not None
        index = torch.tensor(keep)
        self._mask = self._mask[index]
        first = int(self._mask.any(dim=0).nonzero()[0])  # columns before: padding only
        for layer in self._cache.layers:
            layer.keys = layer.keys[index.to(layer.keys.device), :, first:]
            layer.values = layer.values[index.to(layer.values.device), :, first:]
        self._mask = self._mask[:, first:]

    def _bytes_per_token(self) -> int:
        """One token's KV bytes in one row, read off the batch's own tensors."""
        layers = getattr(self._cache, "layers", None) or []
        total = 0
        for layer in layers:
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if isinstance(keys, torch.Tensor) and keys.dim() == 4:
                total += keys[0, :, 0].numel() * keys.element_size()
            if isinstance(values, torch.Tensor) and values.dim() == 4:
                total += values[0, :, 0].numel() * values.element_size()
        return total

    def _end(
        self,
        row: Row,
        *,
        finish: str = "cancelled",
        kv_bytes: int = 0,
        error: BaseException | None = None,
    ) -> None:
        if error is None:
            if not row.scanner.stopped:
                row.stream.emit(row.scanner.push(self._decode(row.produced), final=True))
            row.result = DecodeResult(
                row.scanner.text,
                len(row.task.prompt_ids),
                len(row.produced),
                finish,
                row.steps,
                kv_tokens=row.position,
                kv_bytes=kv_bytes,
            )
        row.error = error
        row.done.set()

    def _fail(self, rows: list[Row], exc: BaseException) -> None:
        """A failed forward: its rows (and the whole batch's state) are given up."""
        log.warning("a batched generation step failed: %s: %s", type(exc).__name__, exc)
        self._cache = self._mask = None
        failed = {id(row): row for row in rows}
        self._rows = []
        with self._cond:
            for row in failed.values():
                with contextlib.suppress(ValueError):
                    self._pending.remove(row)
        for row in failed.values():
            row.cache = None
            self._end(row, error=exc)
