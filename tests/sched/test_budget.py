"""BudgetBook: P95 prices, conservative prices for unseen buckets, persistence."""

from __future__ import annotations

import json
import math

from app.sched.budget import (
    EXTRAPOLATION_MARGIN,
    GEOMETRY_MARGIN,
    MEASURED_MARGIN,
    BudgetBook,
    GenerationSample,
    Geometry,
    PriceKey,
    Quote,
)
from app.sched.entry import (
    DEFAULT_RUN_S,
    ONE_SAMPLE_MARGIN,
    OOM_PENALTY,
    P95_SAMPLES,
    WINDOW,
    p95,
    peak_price,
)

MiB = 2**20


def key(bucket: str, model: str = "m", fingerprint: str = "") -> PriceKey:
    return PriceKey(model, bucket, "cpu:test", "float32", fingerprint)


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


def test_a_price_from_few_samples_allows_for_the_spread_not_seen_yet():
    """Below P95_SAMPLES the nearest-rank P95 is only the largest peak seen: one sample is
    priced ONE_SAMPLE_MARGIN over it, more by the largest plus their spread (equal ones:
    as measured), and a window of P95_SAMPLES by its P95."""
    assert peak_price([1000]) == math.ceil(1000 * ONE_SAMPLE_MARGIN) > 1000
    assert peak_price([1000, 1000, 1000]) == 1000
    assert peak_price([1000, 1200]) == 1400  # the next run may vary as much again
    assert peak_price([1100, 1000, 1200]) == 1400
    many = [1000 + i for i in range(P95_SAMPLES)]
    assert peak_price(many) == p95(many) == 1018


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
    price = math.ceil(9000 * ONE_SAMPLE_MARGIN)  # the larger one's price: one sample's
    assert (quote.nbytes, quote.exclusive, quote.source) == (price, False, "neighbour")


def test_unseen_bucket_above_measured_ones_is_extrapolated_and_exclusive():
    book = BudgetBook()
    book.record(key("s16"), 16, 1000, 0.1)
    book.record(key("s32"), 32, 2000, 0.1)
    quote = book.quote(key("s64"), 64)
    assert quote.exclusive and quote.source == "extrapolated"
    # linear from the nearest smaller's measured bytes, with the extrapolation's margin
    # only: the one-sample allowance of its price (2200) is not stacked on it
    assert quote.nbytes == math.ceil(2000 * 2 * EXTRAPOLATION_MARGIN)
    assert book.quote(key("s32"), 32).nbytes == math.ceil(2000 * ONE_SAMPLE_MARGIN)


def test_a_learned_quote_says_the_peak_it_ran_in():
    """Its price may pass the device by the spread allowed above the samples (a bucket
    measured near the top): the peak it did run in is what can prove it never fits."""
    book = BudgetBook()
    for peak in (900, 1000):
        book.record(key("s16"), 16, peak, 0.1)
    quote = book.quote(key("s16"), 16)
    assert (quote.nbytes, quote.ran_in) == (1100, 1000)
    assert book.quote(key("s64"), 64).ran_in == 0  # not learned: nothing ran


def test_neighbours_are_per_model():
    book = BudgetBook()
    book.record(key("s256", model="other"), 256, 9000, 0.1)
    assert book.quote(key("s64"), 64).source == "unseen"


def test_buckets_of_another_variant_are_no_neighbours():
    # a tiled 1024² decode (~tiled) is cheaper than a full 768²: were it a neighbour by
    # size, the full 768² would borrow its price and run beside others underpriced
    book = BudgetBook()
    book.record(key("px1024x1024xb1~tiled"), 1024 * 1024, 2000, 0.1)
    full = book.quote(key("px768x768xb1"), 768 * 768, prior=5000)
    assert (full.nbytes, full.exclusive, full.source) == (5000, True, "unseen")
    book.record(key("px1024x1024xb1"), 1024 * 1024, 9000, 0.1)
    own = book.quote(key("px768x768xb1"), 768 * 768).nbytes  # its own variant's
    assert own == math.ceil(9000 * ONE_SAMPLE_MARGIN)
    tiled = book.quote(key("px768x768xb1~tiled"), 768 * 768)
    assert (tiled.nbytes, tiled.source) == (math.ceil(2000 * ONE_SAMPLE_MARGIN), "neighbour")


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
    path.write_text(json.dumps({"version": 2, "entries": [{"model": "m"}]}))
    book = BudgetBook(path)
    assert book.snapshot() == []
    assert (tmp_path / "prices.bad").exists() and not path.exists()


def test_a_version_1_price_file_is_relearned_not_applied(tmp_path):
    """Version 1 had no fingerprints: whose weights its prices were for is unknown."""
    path = tmp_path / "prices.json"
    row = {"model": "m", "bucket": "s16", "device": "cpu:test", "dtype": "float32"}
    row |= {"size": 16, "peaks": [5], "run_s": [0.1], "penalty": 1.0}
    path.write_text(json.dumps({"version": 1, "entries": [row]}))
    assert BudgetBook(path).quote(key("s16"), 16).source == "unseen"


def test_prices_of_other_weights_do_not_apply():
    """After `pull --force` (a new fingerprint) the model relearns."""
    book = BudgetBook()
    book.record(key("s16", fingerprint="old"), 16, 1000, 0.1)
    assert book.quote(key("s16", fingerprint="old"), 16).source == "learned"
    assert book.quote(key("s16", fingerprint="new"), 16).source == "unseen"
    assert book.quote(key("s8", fingerprint="new"), 8).source == "unseen"


def test_penalties_decay_as_clean_runs_come_in():
    book = BudgetBook()
    for _ in range(3):
        book.record(key("s16"), 16, 1000, 0.1)
    book.penalize(key("s16"), 16, alone=False, pool=10_000)
    book.penalize(key("s16"), 16, alone=False, pool=10_000)
    assert book.quote(key("s16"), 16).nbytes == 2250
    for _ in range(16):  # eight clean runs undo one out-of-memory
        book.record(key("s16"), 16, 1000, 0.1)
    assert book.quote(key("s16"), 16).nbytes == 1000


def test_a_clean_run_disproves_a_floor():
    book = BudgetBook()
    book.penalize(key("s64"), 64, alone=True, pool=50_000)
    assert book.quote(key("s64"), 64).floor == 50_001
    book.record(key("s64"), 64, 20_000, 0.1)
    quote = book.quote(key("s64"), 64)
    assert quote.floor == 0 and quote.nbytes < 50_001


# -- generations: a line, fixed + per token × the token bound -----------------------------
GEOMETRY = Geometry(kv_bytes_per_token=1 * MiB, fixed_bytes=100 * MiB)


def chat(tokens: int, *, clean: bool, per_token: int = 2 * MiB, fixed: int = 50 * MiB):
    """A finished chat whose cache held `tokens` at `per_token` each, above `fixed`."""
    return GenerationSample(tokens, per_token * tokens, fixed + per_token * tokens, 1.0, clean)


def test_an_unmeasured_generation_is_priced_by_its_geometry_and_shares():
    quote = BudgetBook().quote_generation(key("p16"), 16, 1024, GEOMETRY)
    assert quote.source == "geometry" and not quote.exclusive
    assert quote.nbytes == math.ceil((100 * MiB + 1024 * MiB) * GEOMETRY_MARGIN)


def test_a_generation_of_unknown_geometry_runs_alone_until_measured():
    book = BudgetBook()
    unknown = Geometry(0, 0)
    assert book.quote_generation(key("p16"), 16, 1024, unknown).exclusive
    book.record_generation(key("p16"), 16, GenerationSample(40, 0, 80 * MiB, 1.0, True))
    after = book.quote_generation(key("p16"), 16, 1024, unknown)
    assert not after.exclusive and after.source == "learned"
    assert after.nbytes >= 2 * MiB * 1024  # the whole peak counted per token: safe


def test_chats_that_stop_early_teach_every_bucket_of_their_prompt_size():
    """Today's rule learned a bucket only from runs to max_tokens; chats end sooner."""
    book = BudgetBook()
    for length in (20, 35, 80, 130):
        book.record_generation(key("p16"), 16, chat(16 + length, clean=length == 20))
    for bound in (64, 512, 1024):
        quote = book.quote_generation(key("p16"), 16, bound, GEOMETRY)
        assert quote.source == "learned" and not quote.exclusive
        expected = (50 * MiB + 2 * MiB * bound) * MEASURED_MARGIN
        assert quote.nbytes == math.ceil(expected)


def test_the_per_token_rate_is_learned_beside_others_the_fixed_part_only_alone():
    book = BudgetBook()
    book.record_generation(key("p16"), 16, chat(100, clean=False))
    quote = book.quote_generation(key("p16"), 16, 1024, GEOMETRY)
    assert quote.source == "learned_rate"
    fixed_guess = 100 * MiB * GEOMETRY_MARGIN
    assert quote.nbytes == math.ceil(fixed_guess + 2 * MiB * MEASURED_MARGIN * 1024)
    # another prompt bucket of the same model shares the rate
    other = book.quote_generation(key("p256"), 256, 1024, GEOMETRY)
    assert other.source == "learned_rate"


def test_a_generation_bucket_shows_its_line_in_the_snapshot():
    book = BudgetBook()
    book.record_generation(key("p16"), 16, chat(40, clean=True))
    (row,) = book.snapshot()
    assert row["source"] == "learned" and row["per_token_bytes"] == 2 * MiB
    assert row["fixed_bytes"] == 50 * MiB and row["price_bytes"] is None


def test_an_out_of_memory_raises_a_generation_line_and_it_heals():
    book = BudgetBook()
    book.record_generation(key("p16"), 16, chat(40, clean=True))
    before = book.quote_generation(key("p16"), 16, 512, GEOMETRY).nbytes
    book.penalize(key("p16"), 16, alone=False, pool=10**12, generation=True)
    assert book.quote_generation(key("p16"), 16, 512, GEOMETRY).nbytes > before
    for _ in range(8):
        book.record_generation(key("p16"), 16, chat(40, clean=True))
    assert book.quote_generation(key("p16"), 16, 512, GEOMETRY).nbytes == before


def test_generation_lines_survive_a_restart(tmp_path):
    path = tmp_path / "prices.json"
    book = BudgetBook(path)
    book.record_generation(key("p16", fingerprint="abc"), 16, chat(40, clean=True))
    book.save()
    again = BudgetBook(path)
    assert again.snapshot() == book.snapshot()
    k = key("p16", fingerprint="abc")
    assert again.quote_generation(k, 16, 512, GEOMETRY) == book.quote_generation(
        k, 16, 512, GEOMETRY
    )


def test_an_out_of_memory_raises_what_larger_buckets_are_extrapolated_from():
    book = BudgetBook()
    book.record(key("s16"), 16, 1000, 0.1)
    book.penalize(key("s16"), 16, alone=False, pool=10**9)
    measured = math.ceil(1000 * OOM_PENALTY)  # its P95 with its penalty
    assert book.quote(key("s32"), 32).nbytes == math.ceil(measured * 2 * EXTRAPOLATION_MARGIN)


def test_an_unseen_bucket_expects_the_run_time_of_the_nearest_larger_one_measured():
    book = BudgetBook()
    book.record_run_time(key("s8"), 8, 0.01)
    book.record_run_time(key("s64"), 64, 0.4)
    book.record_run_time(key("s32"), 32, 0.2)
    book.record_run_time(key("s32", model="other"), 32, 0.1)  # another model's: no neighbour
    assert book.quote(key("s16"), 16).expected_s == 0.2
    assert book.quote(key("s32"), 32).expected_s == 0.2
    assert book.quote(key("s128"), 128).expected_s == DEFAULT_RUN_S  # none larger measured


def test_the_snapshot_shows_every_bucket_by_model_then_size():
    """What /status shows of the learned prices: one row per bucket, a model's buckets
    from the smallest, each with where its price comes from and its out-of-memories."""
    book = BudgetBook()
    book.record(key("s64", model="b"), 64, 2000, 0.5)
    book.record(key("s32", model="a"), 32, 1000, 0.25)
    book.record_run_time(key("s16", model="a"), 16, 0.125)
    for _ in range(2):
        book.penalize(key("s32", model="a"), 32, alone=False, pool=10**9)
    book.penalize(key("s8", model="b"), 8, alone=False, pool=10**9)  # first seen failing
    rows = book.snapshot()
    assert [(row["model"], row["size"]) for row in rows] == [
        ("a", 16), ("a", 32), ("b", 8), ("b", 64)
    ]  # fmt: skip
    same = {"device": "cpu:test", "dtype": "float32"}
    assert rows[0] == {
        "model": "a", "bucket": "s16", "size": 16, **same, "price_bytes": None,
        "source": "unseen", "samples": 0, "expected_run_s": 0.125, "penalty": 1.0, "ooms": 0,
    }  # fmt: skip
    assert rows[1] == {
        "model": "a", "bucket": "s32", "size": 32, **same,
        "price_bytes": math.ceil(math.ceil(1000 * ONE_SAMPLE_MARGIN) * OOM_PENALTY**2),
        "source": "learned", "samples": 1, "expected_run_s": 0.25,
        "penalty": round(OOM_PENALTY**2, 4), "ooms": 2,
    }  # fmt: skip
    assert rows[2] == {
        "model": "b", "bucket": "s8", "size": 8, **same, "price_bytes": None,
        "source": "unseen", "samples": 0, "expected_run_s": DEFAULT_RUN_S,
        "penalty": OOM_PENALTY, "ooms": 1,
    }  # fmt: skip


def test_each_change_is_marked_for_saving_and_a_save_clears_the_mark(tmp_path):
    """The service saves the book while it is marked (app.core.service): each sample and
    each out-of-memory marks it; a save, into folders not made yet, clears the mark, and
    a restart reads back what was saved, the floor a failure alone set too."""
    path = tmp_path / "state" / "prices" / "prices.json"
    book = BudgetBook(path)
    assert book.dirty is False
    for change in (
        lambda: book.record(key("s16"), 16, 1000, 0.1),
        lambda: book.record_run_time(key("s16"), 16, 0.2),
        lambda: book.record_generation(key("p16"), 16, chat(40, clean=True)),
        lambda: book.penalize(key("s16"), 16, alone=True, pool=5000),
    ):
        change()
        assert book.dirty is True
        book.save()
        assert book.dirty is False
    again = BudgetBook(path)
    assert again.snapshot() == book.snapshot()
    assert again.quote(key("s16"), 16).nbytes == book.quote(key("s16"), 16).nbytes >= 5001


def test_quotes_of_unseen_buckets_in_full():
    """Every field of a quote from a neighbour or extrapolated: the bytes (never under a
    floor a failure alone set, nor under the prior), whether it runs alone, the source,
    the run time of the nearest larger bucket measured and the floor."""
    book = BudgetBook()
    book.record(key("s256"), 256, 9000, 0.1)
    price = math.ceil(9000 * ONE_SAMPLE_MARGIN)
    assert book.quote(key("s64"), 64) == Quote(price, False, "neighbour", 0.1)
    assert book.quote(key("s64"), 64, prior=60_000) == Quote(60_000, False, "neighbour", 0.1)
    book.penalize(key("s64"), 64, alone=True, pool=50_000)  # failed alone, never measured
    assert book.quote(key("s64"), 64) == Quote(50_001, False, "neighbour", DEFAULT_RUN_S)
    guess = math.ceil(9000 * 2 * EXTRAPOLATION_MARGIN)
    assert book.quote(key("s512"), 512) == Quote(guess, True, "extrapolated", DEFAULT_RUN_S)
    assert book.quote(key("s512"), 512, prior=10**6).nbytes == 10**6
    book.penalize(key("s512"), 512, alone=True, pool=10**7)
    floor = 10**7 + 1
    assert book.quote(key("s512"), 512) == Quote(floor, True, "extrapolated", DEFAULT_RUN_S, floor)


def test_generation_quotes_in_full():
    book = BudgetBook()
    unknown = Geometry(kv_bytes_per_token=0, fixed_bytes=100 * MiB)
    assert book.quote_generation(key("p16"), 16, 1024, unknown) == Quote(
        100 * MiB, True, "unseen", DEFAULT_RUN_S, 0
    )
    book.record_generation(key("p16"), 16, chat(40, clean=True))
    line = math.ceil((50 * MiB + 2 * MiB * 1024) * MEASURED_MARGIN)
    assert book.quote_generation(key("p16"), 16, 1024, GEOMETRY) == Quote(
        line, False, "learned", 1.0, 0
    )
    book.penalize(key("p16"), 16, alone=True, pool=10**12, generation=True)
    quote = book.quote_generation(key("p16"), 16, 1024, GEOMETRY)
    assert (quote.nbytes, quote.floor) == (10**12 + 1, 10**12 + 1)


def test_a_model_that_cannot_tell_its_cache_counts_its_whole_peak_per_token():
    book = BudgetBook()
    book.record_generation(key("p16"), 16, GenerationSample(40, 0, 80 * MiB, 1.0, True))
    (row,) = book.snapshot()
    assert (row["per_token_bytes"], row["fixed_bytes"]) == (2 * MiB, 0)  # 80 MiB / 40
    quote = book.quote_generation(key("p16"), 16, 1024, Geometry(0, 0))
    assert quote.nbytes == math.ceil(2 * MiB * MEASURED_MARGIN * 1024)


def test_an_unmeasured_prompt_bucket_takes_its_fixed_part_from_a_measured_one():
    """The smallest larger bucket's fixed part as it is; else the largest smaller one's
    scaled to the prompt, with a margin (prefill's activations grow with it); never
    under the geometry's."""
    book = BudgetBook()
    book.record_generation(key("p16", model="other"), 16, chat(40, clean=True, fixed=900 * MiB))
    book.record(key("s16"), 16, 10**9, 0.1)  # a one-shot bucket of the model: no fixed part
    book.record_generation(key("p16"), 16, chat(40, clean=True))  # fixed: 50 MiB
    small = Geometry(kv_bytes_per_token=1 * MiB, fixed_bytes=10 * MiB)
    for bucket, size, fixed in (
        ("p8", 8, 50 * MiB),
        ("p64", 64, math.ceil(50 * MiB * 64 / 16 * EXTRAPOLATION_MARGIN)),
    ):
        quote = book.quote_generation(key(bucket), size, 0, small)
        base = math.ceil(fixed * GEOMETRY_MARGIN)
        assert quote == Quote(base, False, "learned_rate", DEFAULT_RUN_S), bucket
    large = Geometry(kv_bytes_per_token=1 * MiB, fixed_bytes=80 * MiB)
    assert book.quote_generation(key("p8"), 8, 0, large).nbytes == math.ceil(
        80 * MiB * GEOMETRY_MARGIN
    )


def test_a_generation_row_counts_every_run_and_says_its_line_is_half_learned():
    book = BudgetBook()
    for _ in range(2):  # beside others: the rate is its own, the fixed part is not
        book.record_generation(key("p16"), 16, chat(40, clean=False))
    (row,) = book.snapshot()
    assert (row["source"], row["samples"]) == ("learned_rate", 2)
    assert (row["fixed_bytes"], row["per_token_bytes"]) == (None, 2 * MiB)


def test_a_generation_bucket_first_seen_failing_is_a_generation_line():
    book = BudgetBook()
    book.penalize(key("p16"), 16, alone=False, pool=10**9, generation=True)
    (row,) = book.snapshot()
    assert (row["source"], row["fixed_bytes"], row["ooms"]) == ("geometry", None, 1)
