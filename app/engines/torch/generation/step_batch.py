"""Step-level batching of generation: each decode step runs a model's streams as one forward.

One thread per model owns the batch; a stream's caller (an executor stream thread) hands
its row in and waits. New rows are prefilled (short prompts together, a long one alone in
chunks, so running rows wait at most one chunk) and join at the next step boundary: KV
caches left-padded to one length and concatenated, a mask hiding the padding, position ids
counting each row's own tokens (TGI's `CausalLMBatch.concatenate`). An idle batcher lets a
burst finish arriving first; rows sharing a prompt prefix are prefilled packed, the prefix
once (`packing`), or copy it from a running row (`kv_cache`), both beside this module. A row
that ends (end of sequence, stop string, `max_tokens`, client gone) leaves at the next
boundary and columns no row uses are cut. Each row samples with its own parameters and
seeded generator (its text does not depend on who shares its batch, up to kernel
rounding: see docs/admission.md). Admission stays the gate's: a row exists only once its KV
bytes were admitted (at most `max_streams`); rows whose padding a batch could not hold
within that step in a batch of their own; a cache that is not plain dynamic (sliding
windows) runs rows one at a time.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from app.engines.torch.generation.constrained import Constraint
from app.engines.torch.generation.forward_cost import ForwardCost
from app.engines.torch.generation.kv_cache import (
    MIN_SHARED,
    Batch,
    Kept,
    Source,
    best_source,
    better,
    common_prefix,
    copied_inputs,
    copied_prefixes,
    fits,
    kept_row,
    suffix_inputs,
)
from app.engines.torch.generation.packing import packed_inputs, shared_prefix, unpacked
from app.engines.torch.generation.rows import Row
from app.engines.torch.generation.sampling import sample, token_logprob
from app.models.decoding import DecodeResult, GenerationInput, IncrementalText, TokenStream
from app.models.prefix_cache import Entry, PrefixStore

log = logging.getLogger("vramgate.generation")

PREFILL_CHUNK = 256  # a long prompt is prefilled this many tokens per step
PREFILL_TOKENS = 512  # short prompts prefilled together: at most this many (padded) tokens
GATHER_QUIET_S = 0.002  # idle: a burst has ended when nothing arrived for this long
GATHER_MOST_S = 0.010  # ... or after this long


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
        packable: bool = False,
        dtype: torch.dtype = torch.float32,
        constrain: Callable[[str], Constraint] | None = None,
        store: PrefixStore | None = None,
        tokens: Callable[[str], list[int]] | None = None,
    ) -> None:
        """`forward` is the model; `decode` token ids to text; `on_forward` counts steps;
        `cost` learns what a forward costs from the forwards run here; `packable`: the
        model honours packed prefills' masks (`packing`), `dtype` its floats;
        `constrain` makes a row's grammar state from its compiled grammar; `store`
        keeps ended rows' KV for later prompts that begin the same way (None: off);
        `tokens` spells a thinking tag in token ids (a row's thinking budget)."""
        self._forward = forward
        self._decode = decode
        self._eos = eos
        self._device = device
        self._cache_arg = cache_arg
        self._extra: dict[str, Any] = {"logits_to_keep": 1} if keep_last_logits else {}
        self._job_stream = job_stream
        self._on_forward = on_forward
        self.cost = cost or ForwardCost()
        self.packable = packable and joinable and keep_last_logits
        self._dtype = dtype
        self._constrain = constrain
        self._tokens = tokens
        self._name = name
        self._store = store if joinable else None  # rows of other caches cannot be copied
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
        row = Row.start(task, stream, bound, self._constrain, self._tokens)
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
                    if not self._batches and self.joinable:
                        self._gather()
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
            row.end(self._decode, error=RuntimeError("the model is unloaded"))

    def _gather(self) -> None:
        """Idle, with a row just handed in (under the lock): wait while more keep arriving
        (GATHER_QUIET_S apart, GATHER_MOST_S in all), so that a burst of requests is
        prefilled as one group rather than its first alone and the rest a forward later."""
        deadline = time.monotonic() + GATHER_MOST_S
        while not self._closed:
            count, left = len(self._pending), deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(min(GATHER_QUIET_S, left))
            if len(self._pending) == count:
                return

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
                row.end(self._decode, finish="cancelled")
                continue
            remaining = len(row.task.prompt_ids) - row.position
            if remaining > PREFILL_CHUNK or row.cache is not None or row.own_kv:
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
            row.stream.beat()  # alive: its prefill comes now
        return taken

    def _later(self, row: Row, taken: list[Row]) -> bool:
        """Whether `row` should wait one forward and copy the prompt prefix it shares with
        a row prefilled now, instead of computing it again beside it: when no running row
        offers as much and the device's measured cost says the tokens saved outweigh a
        forward (on a CPU, a shared system prompt; on a GPU, rarely)."""
        prompt = row.task.prompt_ids
        if self.packable:  # a packed group keeps the prefix all its rows share
            group = [other.task.prompt_ids for other in taken]
            return len(group) > 1 and shared_prefix(group) >= MIN_SHARED > shared_prefix(
                [*group, prompt]
            )
        mine = [other.task.prompt_ids for other in taken if other.scope == row.scope]
        shared = max((common_prefix(prompt, ids) for ids in mine), default=0)
        shared = min(shared, len(prompt) - 1)
        if shared < MIN_SHARED:
            return False
        source = best_source(prompt, self._batches, row.scope)
        return (source[3] if source else 0) < shared and self.cost.worth_splitting(shared)

    def _prefill(self, rows: list[Row]) -> int:
        """Prefill `rows` (one forward); returns the tokens it computed."""
        if len(rows) == 1 and rows[0].own_kv:
            return self._prefill_own(rows[0])
        if len(rows) == 1 and (
            rows[0].cache is not None or len(rows[0].task.prompt_ids) > PREFILL_CHUNK
        ):
            return self._prefill_chunk(rows[0])
        ids = [row.task.prompt_ids for row in rows]
        sources = [self._source(row) for row in rows]
        copied = copied_inputs(rows, sources)
        if copied is not None:
            for row, source in zip(rows, sources, strict=True):
                row.cached = source[3] if source else 0
                self._count_hit(source)
        if copied is None and self.packable and len(rows) > 1:
            shared = shared_prefix(ids)
            if shared >= MIN_SHARED:
                return self._prefill_packed(rows, ids, shared)
        input_ids, mask, positions, prefix = copied or (*suffix_inputs(ids, [0] * len(ids)), None)
        out = self._run(input_ids, mask, positions, prefix)
        self._prefilled(rows)
        self._admit(rows, getattr(out, self._cache_arg), mask, out.logits[:, -1])
        return int(input_ids.numel())

    def _prefill_packed(self, rows: list[Row], ids: list[list[int]], shared: int) -> int:
        """Prefill `rows`, whose prompts begin with `shared` common tokens, as one packed
        sequence (`packing`), then split its cache into one row per prompt."""
        packed = packed_inputs(ids, shared, self._dtype)
        out = self._run(packed.input_ids, packed.mask, packed.positions, None, packed.last)
        self._prefilled(rows)
        self._first_tokens(rows, out.logits[0])  # sent before the cache is split
        split = unpacked(getattr(out, self._cache_arg), packed.columns)
        if split is None:
            raise RuntimeError("this version of transformers cannot split a packed cache")
        self._admit(rows, split[0], split[1], None)
        return int(packed.input_ids.numel())

    def _prefill_own(self, row: Row) -> int:
        """A prompt whose prefill takes more than ids (images), alone and in one forward:
        the image's tokens and its pixels must meet in the same forward, and its KV is
        its own (no running or kept row's prefix is copied)."""
        prompt = row.task.prompt_ids
        extra = {
            name: value.to(self._device, self._dtype if value.is_floating_point() else None)
            for name, value in (row.task.prefill_inputs or {}).items()
        }
        mask = torch.ones((1, len(prompt)), dtype=torch.long)
        positions = torch.arange(len(prompt)).unsqueeze(0)
        out = self._run(torch.tensor([prompt]), mask, positions, None, extra=extra)
        self._prefilled([row])
        self._admit([row], getattr(out, self._cache_arg), mask, out.logits[:, -1])
        return len(prompt)

    def _prefilled(self, rows: list[Row]) -> None:
        with self._cond:
            for row in rows:
                self._pending.remove(row)
        for row in rows:
            row.position = len(row.task.prompt_ids)
            row.steps += 1

    def _source(self, row: Row) -> Source | None:
        """Where `row`'s prompt prefix is held already: a running row's, or a kept one
        of the prefix cache, whichever holds more of it."""
        prompt = row.task.prompt_ids
        if row.own_kv:
            return None
        running = best_source(prompt, self._batches, row.scope)
        if self._store is None or not row.task.params.prefix_cache:
            return running
        entry, count = self._store.longest(self._name, prompt, scope=row.scope, used=False)
        kept = entry.payload.source(count) if entry is not None else None
        return better(running, kept)

    def _count_hit(self, source: Source | None) -> None:
        """A prefix was copied from `source`: a hit of the prefix cache where it is a
        kept row's (a running row's is not)."""
        if self._store is not None and source is not None and isinstance(source[0], Kept):
            self._store.hit(source[3])

    def _restored(self, row: Row) -> None:
        """A long prompt about to be prefilled: the prefix a running or kept row holds
        becomes its cache, and its chunks start after it."""
        source = self._source(row)
        copied = copied_prefixes([source]) if source is not None else None
        if source is None or copied is None:
            return
        row.cache, row.position = copied[0], source[3]
        row.cached = source[3]
        self._count_hit(source)

    def _prefill_chunk(self, row: Row) -> int:
        """One chunk of a long prompt, in the row's own cache."""
        prompt = row.task.prompt_ids
        if row.cache is None and row.position == 0:
            self._restored(row)
        chunk = prompt[row.position : row.position + PREFILL_CHUNK]
        start, end = row.position, row.position + len(chunk)
        input_ids = torch.tensor([chunk])
        mask = torch.ones((1, end), dtype=torch.long)
        positions = torch.arange(start, end).unsqueeze(0)
        out = self._run(input_ids, mask, positions, row.cache)
        row.cache = getattr(out, self._cache_arg)
        row.position, row.steps = end, row.steps + 1
        row.stream.beat()  # a chunk of its prompt: no token yet
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
        tokens = self._choose(rows, out.logits[:, -1])
        for row, token in zip(rows, tokens, strict=True):
            row.position += 1
            row.steps += 1
            self._advance(row, token)
        self._drop_finished(batch)

    def _run(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        keep: torch.Tensor | None = None,  # the positions whose logits are wanted
        extra: dict[str, Any] | None = None,  # more model inputs (an image's pixels)
    ) -> Any:
        kwargs: dict[str, Any] = {**self._extra, **(extra or {})}
        if keep is not None:
            kwargs["logits_to_keep"] = keep.to(self._device)
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
    def _admit(
        self, rows: list[Row], cache: Any, mask: torch.Tensor, logits: torch.Tensor | None
    ) -> None:
        """Freshly prefilled rows: sample their first tokens (None: already sampled), join
        a batch that can take them, or step as a batch of their own."""
        if logits is not None:
            self._first_tokens(rows, logits)
        length = int(mask.shape[1])
        batch = next((b for b in self._batches if b.takes(rows, length)), None)
        if batch is None:
            batch = Batch(list(rows), cache, mask)
            self._batches.append(batch)
        else:
            batch.join(rows, cache, mask)
        self._drop_finished(batch)

    def _first_tokens(self, rows: list[Row], logits: torch.Tensor) -> None:
        for row, token in zip(rows, self._choose(rows, logits), strict=True):
            self._advance(row, token)

    def _choose(self, rows: list[Row], logits: torch.Tensor) -> list[int]:
        """Each row's next token from its row of `logits`: the plain greedy rows' argmax
        all at once on the model's device (one copy back, not one per row), the others
        through their own sampling."""
        greedy = [i for i, row in enumerate(rows) if row.plain_greedy]
        chosen: dict[int, int] = {}
        if greedy:
            picks = logits[greedy].argmax(dim=-1) if len(greedy) < len(rows) else None
            picks = logits.argmax(dim=-1) if picks is None else picks
            chosen = dict(zip(greedy, picks.tolist(), strict=True))
        return [
            chosen[i] if i in chosen else self._sample(row, logits[i]) for i, row in enumerate(rows)
        ]

    def _sample(self, row: Row, logits: torch.Tensor) -> int:
        allowed = row.constraint.allowed() if row.constraint is not None else None
        task, top = row.task, row.task.params.logprobs
        token = sample(logits, task.params, row.sampler, row.produced, task.prompt_ids, allowed)
        if top is not None and token not in self._eos:
            row.logprobs.append(token_logprob(logits, token, top, self._decode))
        return token

    def _advance(self, row: Row, token: int) -> None:
        """A row's new token (the close tag's instead, where its thinking budget is
        spent): end of sequence, a stop string, or text to send; a row whose grammar is
        complete ends."""
        if row.thinking is not None:
            token = row.thinking.next(token)
        if row.constraint is not None and not row.constraint.accept(token):
            log.warning("row ended: its grammar refused token %d", token)
            row.finish = "stop"
            return
        if token in self._eos:
            row.finish = "stop"
            return
        row.produced.append(token)
        if row.text is None:
            row.text = IncrementalText(self._decode)
        row.stream.emit(row.scanner.push(row.text.extend(row.produced)))
        if row.scanner.stopped or (row.constraint is not None and row.constraint.complete):
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
        for index, row in enumerate(batch.rows):
            if row.finish is not None:
                self._keep(batch, index, row)
                row.end(self._decode, finish=row.finish, kv_bytes=per_token * row.position)
        if not keep:
            self._batches.remove(batch)
            return False
        batch.keep(keep)
        return True

    def _keep(self, batch: Batch, index: int, row: Row) -> None:
        """An ended row's KV goes to the prefix cache, under the tokens it holds (the
        prompt and the answer's tokens fed back), where the store has room for it."""
        store = self._store
        if store is None or row.finish == "cancelled" or not row.task.params.prefix_cache:
            return
        if row.own_kv:  # its ids alone do not say what its KV saw
            return
        prompt = row.task.prompt_ids
        ids = tuple(prompt) + tuple(row.produced[: row.position - len(prompt)])
        if len(ids) < MIN_SHARED or store.covers(self._name, ids, row.scope):
            return
        if not store.make_room(self._name, ids, batch.token_bytes() * row.position, row.scope):
            return  # not copied at all: the copy itself would take bytes no one admitted
        kept: Kept = kept_row(batch, index)
        store.put(Entry(self._name, ids, kept.nbytes, kept, scope=row.scope))

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
            row.end(self._decode, error=exc)
