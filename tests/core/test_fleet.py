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
