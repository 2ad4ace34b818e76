"""BudgetBook: P95 prices, conservative prices for unseen buckets, persistence."""

from __future__ import annotations

import json

from app.sched.budget import WINDOW, BudgetBook, PriceKey, p95


def key(bucket: str, model: str = "m") -> PriceKey:
    return PriceKey(model, bucket, "cpu:test", "float32")


def test_p95_is_nearest_rank():
    assert p95(list(range(1, 101))) == 95
    assert p95([7]) == 7


def test_price_is_p95_of_the_window():
    book = BudgetBook()
    for peak in range(1, 101):
        book.record(key("s16"), 16, peak * 1000, 0.01)
    quote = book.quote(key("s16"), 16)
    # the window keeps the last WINDOW samples: 37..100 -> nearest-rank P95
    window = list(range(101 - WINDOW, 101))
    assert quote.nbytes == p95(window) * 1000
    assert (quote.exclusive, quote.source) == (False, "learned")


def test_a_new_sample_changes_a_price_already_quoted():
    book = BudgetBook()
    for _ in range(10):
        book.record(key("s16"), 16, 1000, 0.1)
    first = book.quote(key("s16"), 16)
    assert (first.nbytes, first.expected_s) == (1000, 0.1)
    for _ in range(10):
        book.record(key("s16"), 16, 5000, 0.3)
    book.record_run_time(key("s16"), 16, 0.3)
    second = book.quote(key("s16"), 16)
    assert (second.nbytes, second.expected_s) == (5000, 0.3)


def test_unseen_bucket_with_nothing_known_runs_exclusive_at_its_prior():
    quote = BudgetBook().quote(key("s64"), 64, prior=5000)
    assert (quote.nbytes, quote.exclusive, quote.source) == (5000, True, "unseen")


def test_unseen_bucket_below_a_measured_one_borrows_its_price():
    book = BudgetBook()
    book.record(key("s256"), 256, 9000, 0.1)
    quote = book.quote(key("s64"), 64)
    assert (quote.nbytes, quote.exclusive, quote.source) == (9000, False, "neighbour")


def test_unseen_bucket_above_measured_ones_is_extrapolated_and_exclusive():
    book = BudgetBook()
    book.record(key("s16"), 16, 1000, 0.1)
    book.record(key("s32"), 32, 2000, 0.1)
    quote = book.quote(key("s64"), 64)
    assert quote.exclusive and quote.source == "extrapolated"
    assert quote.nbytes > 4000  # linear from the nearest smaller, plus a margin


def test_neighbours_are_per_model():
    book = BudgetBook()
    book.record(key("s256", model="other"), 256, 9000, 0.1)
    assert book.quote(key("s64"), 64).source == "unseen"


def test_overlapped_runs_count_time_not_bytes():
    book = BudgetBook()
    book.record_run_time(key("s16"), 16, 0.5)
    quote = book.quote(key("s16"), 16, prior=10)
    assert quote.source == "unseen" and quote.expected_s == 0.5


def test_out_of_memory_raises_the_price():
    book = BudgetBook()
    book.record(key("s16"), 16, 1000, 0.1)
    before = book.quote(key("s16"), 16).nbytes
    book.penalize(key("s16"), 16, alone=False, pool=10_000)
    assert book.quote(key("s16"), 16).nbytes > before


def test_failing_alone_sets_a_floor_above_the_pool():
    book = BudgetBook()
    book.penalize(key("s4096"), 4096, alone=True, pool=50_000)
    quote = book.quote(key("s4096"), 4096, prior=1000)
    assert quote.floor == 50_001 and quote.nbytes >= 50_001


def test_prices_survive_a_restart(tmp_path):
    path = tmp_path / "prices.json"
    book = BudgetBook(path)
    book.record(key("s16"), 16, 1234, 0.02)
    book.penalize(key("s16"), 16, alone=False, pool=1)
    book.save()
    again = BudgetBook(path)
    assert again.snapshot() == book.snapshot()
    assert again.quote(key("s16"), 16) == book.quote(key("s16"), 16)


def test_unreadable_price_file_is_set_aside(tmp_path):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"version": 1, "entries": [{"model": "m"}]}))
    book = BudgetBook(path)
    assert book.snapshot() == []
    assert (tmp_path / "prices.bad").exists() and not path.exists()
