"""A request's prepared work: what its model's device stage needs (the payload), the
size class it is priced and batched by (its bucket), and how rows of inputs are bucketed
and merged."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Bucket:
    """A size class of jobs that cost about the same; `size` orders buckets of a model."""

    label: str
    size: int


@dataclass(frozen=True)
class Prepared:
    """A preprocessed request: what `forward` needs, its bucket, its token count, how
    many inputs it holds, and the length of its longest input (tokens or words)."""

    bucket: Bucket
    payload: Any
    tokens: int
    count: int = 1
    longest: int = 0
    # a generation: (prompt bucket, token bound), the tokens its KV cache may hold
    kv_bound: tuple[int, int] | None = None
    # what prices it apart from others of its bucket (IMAGES_TAG: a prompt whose prefill
    # also runs a vision encoder); part of its price key
    price_tag: str = ""


IMAGES_TAG = "+images"


def next_pow2(value: int, floor: int = 1) -> int:
    size = max(floor, 1)
    while size < value:
        size *= 2
    return size


def merged_rows(
    parts: list[Prepared], max_batch: int, prepare: Callable[[list[Any]], Prepared]
) -> Prepared | None:
    """Several requests' rows as one forward (`prepare` buckets them), or None when they
    are more than `max_batch` together."""
    if len(parts) == 1:
        return parts[0]
    if sum(p.count for p in parts) > max_batch:
        return None
    return prepare([row for p in parts for row in p.payload])


def length_bucketed(payload: list[Any], lengths: list[int], max_batch: int) -> Prepared:
    """Inputs of `lengths` tokens bucketed by (longest, rounded up to a power of two, at
    least 16) × (count, likewise): how embedders and rerankers are priced and batched."""
    longest = max(lengths)
    seq = next_pow2(longest, 16)
    batch = next_pow2(min(len(lengths), max_batch))
    return Prepared(
        Bucket(f"s{seq}xb{batch}", seq * batch),
        payload,
        sum(lengths),
        count=len(lengths),
        longest=longest,
    )
