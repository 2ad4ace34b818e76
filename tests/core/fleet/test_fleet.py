"""What each device is told to serve: pure, from the config and the placement."""

from __future__ import annotations

import pytest

from app.config.settings import ModelSpec
from app.core.fleet.fleet import lane_specs


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
    from app.config.settings import SimulatedBucket
    from app.core.fleet.fleet import place_models
    from app.devices.simulated import SimulatedDevice
    from tests.support.live import make_settings

    gib = 2**30
    display, idle = SimulatedDevice(8 * gib, 0), SimulatedDevice(4 * gib, 1)
    display.set_external(6 * gib)  # the desktop, a browser
    buckets = (SimulatedBucket(size=16, bytes=2**20, run_ms=1),)
    model = ModelSpec(name="m", kind="simulated", weights=3 * gib, buckets=buckets)
    settings = make_settings(tmp_path, device="simulated:8GiB,4GiB", models=(model,))
    assert place_models(settings, settings.models, [display, idle]) == {"m": ("simulated:1",)}


def test_simulated_model_aliases_let_agents_name_their_own_models(server_factory):
    """Claude Code asks for claude-... names and Codex for gpt-...: with `model_aliases`
    those reach a served model through the official client; the answer keeps the name
    asked for; /v1/models and /status show the aliases; a name neither served nor
    matched stays a 404 listing what is served."""
    import openai

    from app.config.settings import ModelSpec, SimulatedBucket

    sim = ModelSpec(
        name="coder", kind="simulated", buckets=(SimulatedBucket(size=64, bytes=2**20, run_ms=1),)
    )
    aliases = {"claude-*": "coder", "gpt-*": "coder"}
    live = server_factory(device="simulated:1GiB", models=(sim,), model_aliases=aliases)
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model="gpt-5-codex", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert answer.model == "gpt-5-codex" and answer.choices[0].message.content
    listed = {m.id: m for m in client.models.list().data}
    assert listed["coder"].model_extra["aliases"] == ["claude-*", "gpt-*"]
    with live.client() as raw:
        assert raw.get("/status").json()["model_aliases"] == aliases
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(
            model="llama3", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert "coder" in str(refused.value) and refused.value.body["code"] == "model_not_found"
