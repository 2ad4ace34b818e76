"""schemathesis fuzzes the server's own OpenAPI document, in this process, against a live
server on the simulated device with the simulated model: no 5xx and no response that
breaks the schema; afterwards the server is healthy, its queue empty, every permit back.
The admin routes are left out: pausing, unloading and shutting down are what they do
(and pausing makes the next requests 503 `paused` by design)."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance

from app.config.settings import ModelSpec, SimulatedBucket
from tests.support.live import live_server, make_settings

MiB = 2**20


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    model = ModelSpec(
        name="sim",
        kind="simulated",
        buckets=(
            SimulatedBucket(size=64, bytes=10 * MiB, run_ms=0),
            SimulatedBucket(size=4096, bytes=100 * MiB, run_ms=0),
        ),
    )
    config = make_settings(
        tmp_path_factory.mktemp("fuzz"),
        device="simulated:4GiB",
        models=(model,),
        default_max_tokens=16,
        health_interval=3600,
    )
    with live_server(config) as live:
        yield live


@pytest.fixture(scope="module")
def api_schema(fuzzed):
    schema = schemathesis.openapi.from_url(fuzzed.url + "/openapi.json")
    return schema.exclude(path_regex="^/admin")


def test_fuzzed_requests_get_no_5xx_and_match_the_schema(api_schema):
    # Driven through hypothesis directly: schemathesis's pytest plugin does not load under
    # this pytest. Every operation of the document, up to 100 generated requests each.
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 8
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=100,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: schemathesis.Case) -> None:
            # Every other body names the served model, so fuzzed fields reach admission,
            # the model and the streams instead of stopping at "no such model".
            if isinstance(case.body, dict) and len(repr(case.body)) % 2 == 0:
                case.body["model"] = "sim"

            # "Schema-valid data is accepted" is not asked of us: a valid model name may
            # name no model (404), a valid input may exceed this model's largest bucket.
            case.call_and_validate(timeout=30, excluded_checks=[positive_data_acceptance])

        fuzz()


def test_after_fuzzing_the_server_is_healthy_and_holds_nothing(fuzzed):
    assert httpx.get(fuzzed.url + "/health", timeout=10).status_code == 200
    status = fuzzed.status()
    assert status["queue"]["depth"] == 0 and status["queue"]["running"] == 0
    assert status["pool"]["admitted_bytes"] == 0
    assert fuzzed.service.scheduler.entries == 0  # nothing waits or runs
