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
its rows one after another. Rows whose padding the batch could not hold within what they
were admitted for step in a batch of their own (app.models.kv_cache).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from app.models.decoding import DecodeResult, GenerationInput, StopScanner, TokenStream
from app.models.forward_cost import ForwardCost
from app.models.kv_cache import (
    MIN_SHARED,
    Batch,
    best_source,
    common_prefix,
    copied_prefixes,
    fits,
    suffix_inputs,
)
from app.models.sampling import sample

log = logging.getLogger("vramgate.generation")

PREFILL_CHUNK = 256  # a long prompt is prefilled this many tokens per step
PREFILL_TOKENS = 512  # short prompts prefilled together: at most this many (padded) tokens


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
    bound: int = 0  # the tokens its stream was admitted for (its bucket's token bound)

    @property
    def most(self) -> int:  # the most tokens its cache will hold: prompt + max_tokens
        return len(self.task.prompt_ids) + self.task.max_tokens

    @property
    def admitted(self) -> int:  # the tokens its admission covered (at least `most`)
        return max(self.bound, self.most)


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
        cost: ForwardCost | None = None,
    ) -> None:
        """`forward` is the model; `decode` token ids to text; `on_forward` counts steps;
        `cost` learns what a forward costs from the forwards run here."""
        self._forward = forward
        self._decode = decode
        self._eos = eos
        self._device = device
        self._cache_arg = cache_arg
        self._extra: dict[str, Any] = {"logits_to_keep": 1} if keep_last_logits else {}
        self._job_stream = job_stream
        self._on_forward = on_forward
        self.cost = cost or ForwardCost()
        self._cond = threading.Condition()
        self._pending: deque[Row] = deque()  # handed in, not yet prefilled (guarded)
        self._closed = False
        self.joinable = joinable  # False: rows run one after another
        self._batches: list[Batch] = []  # owned by the batch thread alone
        self._thread = threading.Thread(target=self._loop, name=f"vramgate-batch-{name}")
        self._thread.daemon = True
        self._thread.start()

    # -- the callers' side ---------------------------------------------------------------
    def generate(self, task: GenerationInput, stream: TokenStream, bound: int = 0) -> DecodeResult:
        """Run one stream in a batch; returns when it ended (on the caller's thread).
        `bound`: the tokens its admission covered (its bucket's token bound)."""
        sampler = torch.Generator()
        if task.params.seed is not None:
            sampler.manual_seed(task.params.seed)
        else:
            sampler.seed()
        row = Row(task, stream, sampler, StopScanner(task.params.stop), bound=bound)
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
    def rows(self) -> int:  # streams in the running batches (read for tests and /status)
        return sum(len(batch.rows) for batch in self._batches)

    @property
    def batches(self) -> int:
        return len(self._batches)

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
                    while not self._pending and not self._batches and not self._closed:
                        self._cond.wait()
                    if self._closed and not self._batches:
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
                    for batch in list(self._batches):
                        self._step(batch)
                except Exception as exc:  # the forward failed: every row in it fails
                    running = [row for batch in self._batches for row in batch.rows]
                    self._fail([*joiners, *running], exc)
        for row in failed:
            self._end(row, error=RuntimeError("the model is unloaded"))

    def _take_joiners(self) -> list[Row]:
        """Rows to prefill now (under the lock): short prompts together, or a long one."""
        if not self.joinable and self._batches:
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
            if taken and self._later(row, taken):
                continue  # it copies the prefix it shares with one of `taken` next forward
            length = max(longest, remaining)
            group = [(len(r.task.prompt_ids), r.most, r.admitted) for r in [*taken, row]]
            if taken and ((len(taken) + 1) * length > PREFILL_TOKENS or not fits(group, length)):
                break
            taken.append(row)
            longest = length
            if not self.joinable:
                break
        for row in taken:
            row.stream.emit("")  # alive: its prefill comes now
        return taken

    def _later(self, row: Row, taken: list[Row]) -> bool:
        """Whether `row` should wait one forward and copy the prompt prefix it shares with
        a row prefilled now, instead of computing it again beside it: when no running row
        offers as much and the device's measured cost says the tokens saved outweigh a
        forward (on a CPU, a shared system prompt; on a GPU, rarely)."""
        prompt = row.task.prompt_ids
        shared = max(common_prefix(prompt, other.task.prompt_ids) for other in taken)
        shared = min(shared, len(prompt) - 1)
        if shared < MIN_SHARED:
            return False
        source = best_source(prompt, self._batches)
        return (source[3] if source else 0) < shared and self.cost.worth_splitting(shared)

    def _prefill(self, rows: list[Row]) -> int:
        """Prefill `rows` (one forward); returns the tokens it computed."""
        if len(rows) == 1 and (
            rows[0].cache is not None or len(rows[0].task.prompt_ids) > PREFILL_CHUNK
        ):
            return self._prefill_chunk(rows[0])
        ids = [row.task.prompt_ids for row in rows]
        inputs = self._copied_inputs(rows) or (*suffix_inputs(ids, [0] * len(ids)), None)
        input_ids, mask, positions, prefix = inputs
        out = self._run(input_ids, mask, positions, prefix)
        with self._cond:
            for row in rows:
                self._pending.remove(row)
        for row in rows:
            row.position = len(row.task.prompt_ids)
            row.steps += 1
        self._admit(rows, getattr(out, self._cache_arg), mask, out.logits[:, -1])
        return int(input_ids.numel())

    def _copied_inputs(
        self, rows: list[Row]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any] | None:
        """Inputs that copy each row's prompt prefix from a running row where one shares
        it; None when none does, or when the copy would pad the group past its bounds."""
        sources = [best_source(row.task.prompt_ids, self._batches) for row in rows]
        if not any(sources):
            return None
        copied = copied_prefixes(sources)
        if copied is None:
            return None
        prefix, prefix_mask = copied
        counts = [source[3] if source else 0 for source in sources]
        ids = [row.task.prompt_ids for row in rows]
        input_ids, mask, positions = suffix_inputs(ids, counts)
        mask = torch.cat([prefix_mask, mask], dim=1)
        held = [(len(p), row.most, row.admitted) for p, row in zip(ids, rows, strict=True)]
        if not fits(held, mask.shape[1]):
            return None
        return input_ids, mask, positions, prefix

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

    def _step(self, batch: Batch) -> None:
        """One decode step of every row in `batch`."""
        for row in batch.rows:
            if row.stream.cancelled.is_set():
                row.finish = "cancelled"
        if not self._drop_finished(batch):
            return
        rows = batch.rows
        input_ids = torch.tensor([[row.next_token] for row in rows])
        mask = torch.cat([batch.mask, batch.mask.new_ones((len(rows), 1))], dim=1)
        positions = torch.tensor([[row.position] for row in rows])
        out = self._run(input_ids, mask, positions, batch.cache)
        batch.cache, batch.mask = getattr(out, self._cache_arg), mask
        for index, row in enumerate(rows):
            row.position += 1
            row.steps += 1
            self._advance(row, sample(out.logits[index, -1], row.task.params, row.sampler))
        self._drop_finished(batch)

    def _run(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> Any:
        kwargs = dict(self._extra)
        if cache is not None:
            kwargs[self._cache_arg] = cache
        device = self._device
        started = time.perf_counter()
        with torch.inference_mode():
            out = self._forward(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                use_cache=True,
                **kwargs,
            )
        if device.type == "cuda":  # its time is known once its work ran
            torch.cuda.current_stream(device).synchronize()
        self.cost.record(int(input_ids.numel()), time.perf_counter() - started)
        self._on_forward()
        return out

    # -- rows joining, advancing and leaving ---------------------------------------------
    def _admit(self, rows: list[Row], cache: Any, mask: torch.Tensor, logits: torch.Tensor) -> None:
        """Freshly prefilled rows: sample their first tokens, join a batch that can take
        them, or step as a batch of their own."""
        for index, row in enumerate(rows):
            self._advance(row, sample(logits[index], row.task.params, row.sampler))
        length = int(mask.shape[1])
        batch = next((b for b in self._batches if b.takes(rows, length)), None)
        if batch is None:
            batch = Batch(list(rows), cache, mask)
            self._batches.append(batch)
        else:
            batch.join(rows, cache, mask)
        self._drop_finished(batch)

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

    def _drop_finished(self, batch: Batch) -> bool:
        """Rows that ended leave `batch`; False when none is left (the batch is gone)."""
        keep = [i for i, row in enumerate(batch.rows) if row.finish is None]
        if len(keep) == len(batch.rows):
            return True
        per_token = batch.token_bytes()
        for row in batch.rows:
            if row.finish is not None:
                self._end(row, finish=row.finish, kv_bytes=per_token * row.position)
        if not keep:
            self._batches.remove(batch)
            return False
        batch.keep(keep)
        return True

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
        """A failed forward: its rows (and every batch's state) are given up."""
        log.warning("a batched generation step failed: %s: %s", type(exc).__name__, exc)
        self._batches = []
        failed = {id(row): row for row in rows}
        with self._cond:
            for row in failed.values():
                with contextlib.suppress(ValueError):
                    self._pending.remove(row)
        for row in failed.values():
            row.cache = None
            self._end(row, error=exc)
