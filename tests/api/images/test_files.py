"""The kept images behind `response_format: url`, on an injected clock: kept for their
time, then gone; the oldest pushed out beyond the count or the bytes."""

from __future__ import annotations

from app.api.images.files import ImageFiles


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_image_is_kept_for_its_time_and_then_gone():
    clock = Clock()
    files = ImageFiles(ttl_s=60, clock=clock)
    key = files.put(b"png bytes", "png")
    clock.now = 59.9
    kept = files.get(key)
    assert kept is not None and (kept.data, kept.media_type) == (b"png bytes", "image/png")
    clock.now = 60.0
    assert files.get(key) is None


def test_beyond_the_count_or_the_bytes_the_oldest_go_first():
    files = ImageFiles(ttl_s=60, max_files=2, max_bytes=10, clock=Clock())
    one, two, three = (files.put(b"abc", "webp") for _ in range(3))
    assert files.get(one) is None and files.get(two) is not None and files.get(three) is not None
    big = files.put(b"0123456789", "jpeg")  # 10 bytes: room only for it
    assert [files.get(k) is not None for k in (two, three, big)] == [False, False, True]
    assert files.get(big).media_type == "image/jpeg"  # type: ignore[union-attr]


def test_keys_are_long_and_unguessable():
    files = ImageFiles(ttl_s=60)
    keys = {files.put(b"x", "png") for _ in range(50)}
    assert len(keys) == 50 and all(len(k) >= 21 for k in keys)


def test_expired_images_leave_memory_when_the_next_is_kept_not_only_when_read():
    clock = Clock()
    files = ImageFiles(ttl_s=60, clock=clock)
    for _ in range(3):
        files.put(b"x" * 100, "png")
    clock.now = 61.0
    files.put(b"new", "png")  # nobody read the three: they go now all the same
    assert files._bytes == 3 and len(files._kept) == 1
