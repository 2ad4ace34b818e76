"""SimulatedHandler: declared buckets, real accounting on the device, injected faults."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.config.settings import FaultInjection, ModelSpec, SimulatedBucket
from app.devices.simulated import SimulatedDevice
from app.engines.simulated.model import SimulatedHandler
from app.errors import InvalidRequest

MiB = 2**20


def handler(inject: FaultInjection | None = None) -> tuple[SimulatedHandler, SimulatedDevice]:
    spec = ModelSpec(
        name="sim",
        kind="simulated",
        inject=inject or FaultInjection(),
        buckets=(
            SimulatedBucket(size=4, bytes=10 * MiB, run_ms=0),
            SimulatedBucket(size=16, bytes=40 * MiB, run_ms=0),
        ),
    )
    device = SimulatedDevice(100 * MiB)
    model = SimulatedHandler(spec)
    model.load(device)
    return model, device


def test_words_pick_the_smallest_declared_bucket_that_holds_them():
    model, _ = handler()
    assert model.preprocess(["one two"]).bucket.label == "w4"
    assert model.preprocess(["one two three", "four five"]).bucket.label == "w16"
    assert model.prior_bytes(model.preprocess(["x"]).bucket) == 10 * MiB
    with pytest.raises(InvalidRequest, match="at most 16"):
        model.preprocess(["w " * 17])


def test_forward_really_occupies_its_declared_bytes():
    model, device = handler()
    device.begin_peak()
    model.forward(model.preprocess(["a b c d e"]))
    assert device.peak() == 40 * MiB and device.allocated() == 0


def test_vectors_are_deterministic_unit_vectors():
    model, _ = handler()
    first = model.postprocess(model.forward(model.preprocess(["same", "other"])))
    again = model.postprocess(model.forward(model.preprocess(["same"])))
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, rtol=1e-6)


def test_faults_are_injected_on_the_chosen_calls():
    model, _ = handler(FaultInjection(oom_on_calls=(2,), fatal_on_calls=(3,), error_on_calls=(4,)))
    prepared = model.preprocess(["x"])
    model.forward(prepared)
    with pytest.raises(torch.OutOfMemoryError):
        model.forward(prepared)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        model.forward(prepared)
    with pytest.raises(ValueError, match="injected"):
        model.forward(prepared)
    model.forward(prepared)
    assert model.forward_calls == 5
