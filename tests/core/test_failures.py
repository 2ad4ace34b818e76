"""What a refused ticket or an expired wait tells the caller (app.core.failures): its
error, the numbers in its body and the retry hint (never under a second)."""

from __future__ import annotations

from app.core.failures import queue_timeout, rejection
from app.errors import ExceedsDevice, QueueFull, QueueTimeout
from app.sched.tickets import Reject


def test_a_request_that_can_never_fit_says_how_many_bytes_against_how_many():
    error = rejection(Reject("exceeds_device", 5000, 4000, 3, 12.0))
    assert isinstance(error, ExceedsDevice) and error.retry_after is None
    assert error.message == (
        "this request needs 5000 bytes of device memory; at most 4000 can ever be "
        "available on this device"
    )
    assert error.details == {"needed_bytes": 5000, "available_bytes": 4000}


def test_a_full_queue_says_its_depth_and_when_to_retry():
    error = rejection(Reject("queue_full", 10, 100, 8, 2.71828))
    assert isinstance(error, QueueFull) and error.retry_after == 2.71828
    assert error.message == "the queue is full (8 waiting); retry in 3s"
    assert error.details == {"reason": "queue_full", "queue_depth": 8, "estimated_wait_s": 2.718}


def test_a_full_queue_with_a_wait_under_a_second_says_retry_in_one():
    error = rejection(Reject("queue_full", 10, 100, 8, 0.2))
    assert error.retry_after == 1.0 and error.message.endswith("retry in 1s")
    assert error.details["estimated_wait_s"] == 0.2


def test_an_expired_wait_says_how_long_and_how_deep_the_queue_is():
    error = queue_timeout(30.0, 4.5, 6)
    assert isinstance(error, QueueTimeout)
    assert error.message == "waited 30s in the queue without being admitted"
    assert (error.retry_after, error.details) == (4.5, {"queue_depth": 6})
    assert queue_timeout(0.5, 0.0, 0).retry_after == 1.0
