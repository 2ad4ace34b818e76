"""KV cache tensors of a generation batch: whether rows can be joined and split, joining
them (left-padded to one length), and prompt prefixes already in the batch.

Prefixes: a joining row whose prompt begins like a running
row's (the same system prompt and chat template, the same question asked again) copies
that row's KV for the shared tokens instead of computing them, and only its own suffix is
prefilled. Each row still holds its own copy, so its KV bytes (and its price) are as
before; what is saved is the prefill's compute, which on a CPU is most of a new
stream's time to first token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

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


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


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


def copied_prefixes(
    cache: Any, mask: torch.Tensor, donors: Sequence[tuple[int, int]]
) -> tuple[Any, torch.Tensor] | None:
    """A cache for the joining rows holding, for each, its donor's first `count` real
    tokens (left-padded to the longest count), and its mask; None where this version of
    transformers cannot build a cache from tensors."""
    try:
        from transformers import DynamicCache
    except ImportError:
        return None
    longest = max(count for _, count in donors)
    columns = []
    for row, count in donors:  # where each donor's real tokens sit in the batch
        real = mask[row].nonzero().flatten()[:count] if count else mask.new_zeros(0)
        columns.append((row, real))
    layers = []
    for layer in cache.layers:
        keys = [_gather(layer.keys, row, real, longest) for row, real in columns]
        values = [_gather(layer.values, row, real, longest) for row, real in columns]
        layers.append((torch.stack(keys), torch.stack(values)))
    prefix_mask = torch.tensor([[0] * (longest - count) + [1] * count for _, count in donors])
    try:
        built = DynamicCache(ddp_cache_data=layers)
    except TypeError:
        return None
    return built, prefix_mask


def _gather(tensor: torch.Tensor, row: int, real: torch.Tensor, length: int) -> torch.Tensor:
    """`row`'s keys or values at the columns `real`, left-padded to `length` tokens."""
    heads, dim = tensor.shape[1], tensor.shape[3]
    out = tensor.new_zeros((heads, length, dim))
    if real.numel():
        out[:, length - real.numel() :] = tensor[row, :, real.to(tensor.device)]
    return out


def suffix_inputs(
    prompts: Sequence[Sequence[int]], shared: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids, mask and position ids of each row's own tokens after its copied
    prefix, left-padded to one length, positions counting on from the prefix."""
    suffixes = [list(p[count:]) for p, count in zip(prompts, shared, strict=True)]
    length = max(len(s) for s in suffixes)
    ids = torch.tensor([[0] * (length - len(s)) + s for s in suffixes])
    mask = torch.tensor([[0] * (length - len(s)) + [1] * len(s) for s in suffixes])
    starts = torch.tensor(shared).unsqueeze(1)
    positions = (starts + mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions
