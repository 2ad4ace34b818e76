"""KV cache tensors of generation batches: whether rows can be joined and split, a batch
of rows (joining, leaving, its footprint), and prompt prefixes already in a batch.

Footprint: a batch is one tensor per layer, every row padded to the batch's length, while
each stream was admitted for its own tokens (prompt + max_tokens). A group joins a batch
only if, until every row has reached its bound, rows × length stays within what the rows
were admitted for (their tokens × MEASURED_MARGIN, the margin every measured price
carries); otherwise it starts a batch of its own, stepped beside the first. So padding
never takes memory the gate did not admit.

Prefixes: a joining row whose prompt begins like a running
row's (the same system prompt and chat template, the same question asked again) copies
that row's KV for the shared tokens instead of computing them, and only its own suffix is
prefilled. Each row still holds its own copy, so its KV bytes (and its price) are as
before; what is saved is the prefill's compute, which on a CPU is most of a new
stream's time to first token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from app.engines.torch.generation.rows import Row
from app.models.prefix_cache import shared_length as common_prefix
from app.sched.budget import MEASURED_MARGIN

MIN_SHARED = 16  # fewer shared tokens are not worth the copy


def plain_dynamic(cache: Any) -> bool:
    """Whether rows can be joined and split in `cache`: every layer a plain DynamicLayer
    (keys and values [batch, heads, tokens, head_dim], grown by concatenation)."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return False
    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def pad_left(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def stack(first: torch.Tensor, second: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """`second`'s rows under `first`'s, both left-padded along `dim` to `length`."""
    return torch.cat([pad_left(first, length, dim), pad_left(second, length, dim)])


def find_donor(prompt: Sequence[int], running: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(index in `running`, tokens to copy) of the running prompt that shares the longest
    prefix with `prompt`, leaving it at least one token of its own to prefill (its first
    token is sampled from that one's logits); (-1, 0) when none shares MIN_SHARED."""
    best, shared = -1, 0
    for index, other in enumerate(running):
        count = min(common_prefix(prompt, other), len(prompt) - 1)
        if count > shared:
            best, shared = index, count
    return (best, shared) if shared >= MIN_SHARED else (-1, 0)


Source = tuple[Any, torch.Tensor, int, int]  # a batch's cache and mask, a row, tokens


def copied_prefixes(sources: Sequence[Source | None]) -> tuple[Any, torch.Tensor] | None:
    """A cache for the joining rows holding, for each, its donor row's first `count` real
    tokens (left-padded to the longest count; None: nothing copied), and its mask; None
    where this version of transformers cannot build a cache from tensors. One indexed read
    per layer and donor batch: a gather per row and layer cost ~30 ms for 6 rows of a
    30-layer model on the CPU."""
    counts = [source[3] if source else 0 for source in sources]
    longest = max(counts)
    template = next(source[0] for source in sources if source)
    groups: dict[int, tuple[Any, list[int], list[int], list[list[int]]]] = {}
    for joiner, source in enumerate(sources):  # by donor batch: rows and their columns
        if source is None:
            continue
        cache, mask, row, count = source
        real = mask[row].nonzero().flatten()[:count].tolist()
        group = groups.setdefault(id(cache), (cache, [], [], []))
        group[1].append(joiner)
        group[2].append(row)
        group[3].append([0] * (longest - count) + real)  # padding reads column 0
    valid = torch.tensor([[0] * (longest - c) + [1] * c for c in counts])
    layers = []
    for index, layer in enumerate(template.layers):
        heads, dim = layer.keys.shape[1], layer.keys.shape[3]
        keys = layer.keys.new_zeros((len(sources), heads, longest, dim))
        values = layer.values.new_zeros((len(sources), heads, longest, layer.values.shape[3]))
        for cache, joiners, rows, columns in groups.values():
            source_layer = cache.layers[index]
            keys[joiners] = take_columns(source_layer.keys, rows, columns, valid[joiners])
            values[joiners] = take_columns(source_layer.values, rows, columns, valid[joiners])
        layers.append((keys, values))
    built = cache_of(layers)
    return None if built is None else (built, valid)


def take_columns(
    tensor: torch.Tensor, rows: Sequence[int], columns: Sequence[Sequence[int]], keep: torch.Tensor
) -> torch.Tensor:
    """From a layer's keys or values [batch, heads, tokens, dim]: for each i, row
    `rows[i]` at the token columns `columns[i]` (all one length; padding reads column 0),
    zeroed where `keep` [i, length] is 0: [len(rows), heads, length, dim]."""
    device = tensor.device
    row_index = torch.tensor(rows, device=device)[:, None]
    col_index = torch.tensor(columns, device=device)
    # [rows, length, heads, dim] -> [rows, heads, length, dim]
    return tensor[row_index, :, col_index].transpose(1, 2) * keep.to(device)[:, None, :, None]


def cache_of(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """A transformers cache of (keys, values) per layer; None where this version of
    transformers cannot build one from tensors."""
    try:
        from transformers import DynamicCache

        return DynamicCache(ddp_cache_data=layers)
    except (ImportError, TypeError):
        return None


def suffix_inputs(
    prompts: Sequence[Sequence[int]], shared: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids, mask and position ids of each row's own tokens after its copied
    prefix (`shared` tokens; 0: the whole prompt), left-padded to one length, positions
    counting on from the prefix."""
    suffixes = [list(p[count:]) for p, count in zip(prompts, shared, strict=True)]
    length = max(len(s) for s in suffixes)
    ids = torch.tensor([[0] * (length - len(s)) + s for s in suffixes])
    mask = torch.tensor([[0] * (length - len(s)) + [1] * len(s) for s in suffixes])
    starts = torch.tensor(shared).unsqueeze(1)
    positions = (starts + mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def fits(rows: Sequence[tuple[int, int, int]], length: int) -> bool:
    """Whether rows of (tokens held now, the most they will hold, tokens admitted) in one
    batch `length` long stay within what they were admitted for until each has ended."""
    end = max(length + most - held for held, most, _ in rows)
    return len(rows) * end <= MEASURED_MARGIN * sum(admitted for _, _, admitted in rows)


class Batch:
    """Rows stepped together: one cache (every layer [rows, heads, length, head_dim]) and
    a mask [rows, length], 1 for a row's real tokens, 0 for padding."""

    def __init__(self, rows: list[Row], cache: Any, mask: torch.Tensor) -> None:
        self.rows = rows
        self.cache = cache
        self.mask = mask.to(torch.long)

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def takes(self, rows: Sequence[Row], length: int) -> bool:
        """Whether `rows`, prefilled `length` long, may join without over-committing."""
        both = [(r.position, r.most, r.admitted) for r in [*self.rows, *rows]]
        return fits(both, max(self.length, length))

    def join(self, rows: list[Row], cache: Any, mask: torch.Tensor) -> None:
        """`rows` (just prefilled in `cache`) under these, both left-padded to one length."""
        length = max(self.length, mask.shape[1])
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = stack(mine.keys, theirs.keys, length, 2)
            mine.values = stack(mine.values, theirs.values, length, 2)
        self.mask = stack(self.mask, mask.to(torch.long), length, 1)
        self.rows.extend(rows)

    def keep(self, keep: list[int]) -> None:
        """Only the rows at `keep` stay; columns that are padding for all of them go."""
        index = torch.tensor(keep)
        mask = self.mask[index]
        first = int(mask.any(dim=0).nonzero()[0])
        for layer in self.cache.layers:
            layer.keys = layer.keys[index.to(layer.keys.device), :, first:]
            layer.values = layer.values[index.to(layer.values.device), :, first:]
        self.mask = mask[:, first:]
        self.rows = [self.rows[i] for i in keep]

    def token_bytes(self) -> int:
        """One token's KV bytes in one row, read off the batch's own tensors."""
        total = 0
        for layer in getattr(self.cache, "layers", None) or []:
            for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(tensor, torch.Tensor) and tensor.dim() == 4:
                    total += tensor[0, :, 0].numel() * tensor.element_size()
        return total


def best_source(prompt: Sequence[int], batches: Sequence[Batch], scope: str) -> Source | None:
    """Where `prompt`'s longest shared prefix (at least MIN_SHARED tokens) is held by a
    running row of the same caller's `scope`: the batch's cache and mask, the row, the
    tokens to copy; None where no such row has it."""
    best: Source | None = None
    for batch in batches:
        ids = [row.shared_ids if row.scope == scope else [] for row in batch.rows]
        index, count = find_donor(prompt, ids)
        if count > (best[3] if best else 0):
            best = (batch.cache, batch.mask, index, count)
    return best


@dataclass
class KeptLayer:
    keys: torch.Tensor  # [1, heads, tokens, head_dim]
    values: torch.Tensor


@dataclass
class Kept:
    """An ended row's KV, kept in the prefix cache (app.models.prefix_cache): one row of
    real tokens, shaped like a batch's cache so that it can be copied from as one."""

    layers: list[KeptLayer]
    mask: torch.Tensor  # [1, tokens], all ones

    @property
    def nbytes(self) -> int:
        tensors = [t for layer in self.layers for t in (layer.keys, layer.values)]
        return sum(t.numel() * t.element_size() for t in tensors)

    def source(self, count: int) -> Source:
        return (self, self.mask, 0, count)


def kept_row(batch: Batch, index: int) -> Kept:
    """Row `index` of `batch`: its real tokens' keys and values, copied out."""
    columns = batch.mask[index].nonzero().flatten()
    layers = []
    for layer in batch.cache.layers:
        where = columns.to(layer.keys.device)
        keys = layer.keys[index : index + 1, :, where].clone()
        values = layer.values[index : index + 1, :, where].clone()
        layers.append(KeptLayer(keys, values))
    return Kept(layers, torch.ones((1, int(columns.numel())), dtype=torch.long))


def better(first: Source | None, second: Source | None) -> Source | None:
    """The source that offers more tokens."""
    if first is None or (second is not None and second[3] > first[3]):
        return second
    return first


def copied_inputs(
    rows: Sequence[Row], sources: Sequence[Source | None]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any] | None:
    """Prefill inputs for `rows` that copy each one's prompt prefix from its source (a
    running row, or a kept one); None when none has one, or when the copy would pad the
    group past its bounds."""
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
