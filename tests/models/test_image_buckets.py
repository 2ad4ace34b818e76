"""Image buckets: labels and their parse, batching by shape and decode, the tiled way."""

from __future__ import annotations

from app.models.image_buckets import ImageBucket, group_of, is_tiled, merged, rows_prepared
from app.models.image_prompt import ImagePrompt


def rows(count: int, side: int = 512, **fields: object) -> list[ImagePrompt]:
    return [
        ImagePrompt(f"p{i}", seed=i, width=side, height=side, **fields)  # type: ignore[arg-type]
        for i in range(count)
    ]


def test_a_label_parses_back_to_its_parts():
    for bucket in (ImageBucket(768, 512, 2), ImageBucket(1024, 1024, 1, tiled=True)):
        assert ImageBucket.parse(bucket.label) == bucket
    assert ImageBucket(1024, 1024, 1, tiled=True).label == "px1024x1024xb1~tiled"
    edit = ImageBucket(512, 512, 2, tiled=True, task="inpainting")
    assert edit.label == "px512x512xb2~inpainting~tiled" and ImageBucket.parse(edit.label) == edit
    assert ImageBucket.parse("px64x64xb1~sliced") is None  # a variant no one makes
    assert ImageBucket.parse("w16") is None


def test_a_batch_is_priced_as_its_power_of_two():
    prepared = rows_prepared(rows(3, 768))
    assert prepared.bucket.label == "px768x768xb4"
    assert prepared.bucket.size == 768 * 768 * 4 and prepared.count == 3


def test_rows_of_one_shape_and_decode_merge_others_do_not():
    a, b = rows_prepared(rows(1)), rows_prepared(rows(2))
    together = merged([a, b], max_batch=4)
    assert together is not None and together.count == 3 and not is_tiled(together)
    assert merged([a, b], max_batch=2) is None  # more rows than a batch
    assert merged([a, rows_prepared(rows(1, steps=9))], max_batch=4) is None  # shapes
    tiled = rows_prepared(rows(1), tiled=True)
    assert merged([a, tiled], max_batch=4) is None  # a full and a tiled decode
    assert group_of(a) != group_of(tiled) and group_of(a) == group_of(b)
    both = merged([tiled, rows_prepared(rows(1), tiled=True)], max_batch=4)
    assert both is not None and both.bucket.label == "px512x512xb2~tiled"
