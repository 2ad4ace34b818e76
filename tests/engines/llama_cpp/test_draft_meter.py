"""The draft meter's verdict by table: nothing judged before enough drafts, drafts
rarely accepted never pay, and with many streams the tokens/s of the requests that
drafted against those that did not decide (pure: no runner)."""

from __future__ import annotations

import pytest

from app.engines.llama_cpp.draft_meter import MIN_SAMPLES, DraftMeter, DraftSample, band


def sample(streams: int, drafted: int, accepted: int, seconds: float) -> DraftSample:
    return DraftSample(streams, tokens=100, drafted=drafted, accepted=accepted, decode_s=seconds)


@pytest.mark.parametrize(
    ("samples", "streams", "pays", "why"),
    [
        ([], 1, True, "measuring"),
        ([sample(1, 100, 5, 1.0)] * 2, 1, True, "measuring"),  # 200 drafted: too few
        ([sample(1, 100, 5, 1.0)] * 3, 1, False, "rarely accepted"),
        ([sample(1, 100, 90, 1.0)] * 3, 1, True, "accepted"),
        # accepted, but at 32 streams the drafting requests ran slower than the others
        ([sample(32, 100, 60, 2.0)] * MIN_SAMPLES + [sample(32, 0, 0, 1.0)] * MIN_SAMPLES,
         32, False, "requests that drafted ran 50.0 tokens/s"),
        # ... which says nothing of one stream
        ([sample(32, 100, 60, 2.0)] * MIN_SAMPLES + [sample(32, 0, 0, 1.0)] * MIN_SAMPLES,
         1, True, "accepted"),
        # faster with drafts: pays
        ([sample(8, 100, 60, 0.5)] * MIN_SAMPLES + [sample(8, 0, 0, 1.0)] * MIN_SAMPLES,
         8, True, "accepted"),
        # too few requests on one side to compare
        ([sample(8, 100, 60, 2.0)] * MIN_SAMPLES + [sample(8, 0, 0, 1.0)] * (MIN_SAMPLES - 1),
         8, True, "accepted"),
    ],
)  # fmt: skip
def test_the_meters_verdict(samples, streams, pays, why):
    meter = DraftMeter()
    for one in samples:
        meter.record(one)
    verdict = meter.verdict(streams)
    assert verdict.pays is pays and why in verdict.why


def test_bands_of_streams_and_the_typical_count():
    assert [band(n) for n in (0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 256)] == [
        1, 1, 2, 2, 3, 3, 4, 5, 5, 6, 6
    ]  # fmt: skip
    meter = DraftMeter()
    assert meter.typical_streams() == 1
    for streams in (1, 8, 8, 8, 32):
        meter.record(sample(streams, 10, 5, 1.0))
    assert meter.typical_streams() == 8
    assert meter.describe()["drafted_tokens"] == 50 and meter.describe()["acceptance"] == 0.5
