"""What each device is told to serve: pure, from the config and the placement."""

from __future__ import annotations

from app.core.fleet import lane_specs
from app.settings import ModelSpec


def test_each_device_serves_its_models_and_only_the_configs_first_preloads():
    specs = (ModelSpec(name="a"), ModelSpec(name="b"), ModelSpec(name="c", load="startup"))
    placement = {"a": ("cuda:0",), "b": ("cuda:0", "cuda:1"), "c": ("cuda:1",)}
    zero, one = lane_specs(specs, placement, "cuda:0"), lane_specs(specs, placement, "cuda:1")
    # on the first device the config's own specs: a reread compares them as they are
    assert zero == specs[:2]
    # on the second, b comes first but is not the config's first: it loads on demand
    assert [(s.name, s.load) for s in one] == [("b", "demand"), ("c", "startup")]
    assert lane_specs(specs, placement, "cuda:2") == ()


def test_models_are_placed_by_the_memory_free_now_not_the_cards_total(tmp_path):
    """A display card already half used by the desktop has less room than a smaller idle
    card: a model goes where it fits now."""
    from app.core.fleet import place_models
    from app.engine.simulated_device import SimulatedDevice
    from app.settings import SimulatedBucket
    from tests.live import make_settings

    gib = 2**30
    display, idle = SimulatedDevice(8 * gib, 0), SimulatedDevice(4 * gib, 1)
    display.set_external(6 * gib)  # the desktop, a browser
    buckets = (SimulatedBucket(size=16, bytes=2**20, run_ms=1),)
    model = ModelSpec(name="m", kind="simulated", weights=3 * gib, buckets=buckets)
    settings = make_settings(tmp_path, device="simulated:8GiB,4GiB", models=(model,))
    assert place_models(settings, settings.models, [display, idle]) == {"m": ("simulated:1",)}
