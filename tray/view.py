"""What the tray shows, derived from one /status document and the supervisor's state.

Pure: no display, no HTTP. The icon is redrawn only when `IconView` changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# starting: the server is not ready yet (or restarting); error: it failed or gave up.
STATES = ("starting", "ready", "busy", "overloaded", "paused", "error")
OVERLOADED_QUEUE_SHARE = 0.8
GiB = 2**30


@dataclass(frozen=True)
class IconView:
    state: str
    vram_fraction: float  # device memory in use by all processes, 0..1
    queued: int


@dataclass(frozen=True)
class ModelLine:
    name: str
    state: str
    weights_bytes: int
    unloads_in_s: float | None = None  # idle: its keep-alive left
    split: str | None = None  # a GGUF's layers between CPU and GPU ("48%/52% CPU/GPU")
    kind: str = ""  # /status models' `kind`: embedding, speech, speech_synthesis, ...


@dataclass(frozen=True)
class TrayView:
    icon: IconView
    tooltip: str
    lines: tuple[str, ...] = ()
    models: tuple[ModelLine, ...] = ()
    paused: bool = False
    restarts: int = 0
    notice: Notice | None = None  # a message for the person, once (a notification)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Notice:
    key: float  # a new key is a new notice: notify once per key
    text: str


def gave_back_notice(gave_back: dict[str, Any] | None) -> Notice | None:
    """ "gave 3.1 GiB back to other programs", from /status `gave_back`."""
    if not gave_back:
        return None
    models = ", ".join(gave_back["models"])
    text = (
        f"vramgate gave {_gib(gave_back['bytes'])} GiB back to other programs (unloaded {models})"
    )
    return Notice(gave_back["at"], text)


def state_of(status: dict[str, Any], rejected_queue_full_delta: int = 0) -> str:
    if status.get("paused"):
        return "paused"
    server_state = status.get("state")
    if server_state == "failed":
        return "error"
    if server_state not in ("ready", "degraded"):
        return "starting"
    queue = status["queue"]
    if rejected_queue_full_delta > 0 or queue["depth"] >= OVERLOADED_QUEUE_SHARE * max(
        queue["max"], 1
    ):
        return "overloaded"
    if queue["running"] or queue["depth"]:
        return "busy"
    return "ready"


TOOLTIP_MAX = 127  # Windows keeps 127 characters of a tray icon's tooltip (szTip[128])


def _gib(value: float) -> str:
    return f"{value / GiB:.1f}"


def _fullest(gpus: list[dict[str, Any]]) -> float:
    """The largest share of memory in use on one GPU (0..1)."""
    return min(1.0, max(g["used_bytes"] / max(g["total_bytes"], 1) for g in gpus))


def _device_line(gpu: dict[str, Any]) -> str:
    return (
        f"{gpu['id']} {gpu['name']}: {_gib(gpu['used_bytes'])} of {_gib(gpu['total_bytes'])} GiB"
        f" · {gpu['running']} running · {gpu['queue_depth']} waiting"
    )


def image_steps(models: list[dict[str, Any]]) -> list[str]:
    """ "paint: image 12/30" for each image batch running (its requests' count after it
    when several share it), from /status models' `running`."""
    lines = []
    for model in models:
        for batch in model.get("running") or ():
            step, steps = batch["steps"][0] if batch["steps"] else (0, 0)
            line = f"{model['name']}: image {step}/{steps}" if steps else f"{model['name']}: image"
            count = len(batch["steps"])
            lines.append(line + (f" ({count} requests)" if count > 1 else ""))
    return lines


def view_of(
    status: dict[str, Any] | None,
    *,
    supervisor_state: str = "running",
    supervisor_message: str = "",
    restarts: int = 0,
    queue_full_delta: int = 0,
) -> TrayView:
    """The tray's view; `status` None means the server is not answering (yet)."""
    if supervisor_state in ("gave_up", "stopped") or status is None:
        state = "error" if supervisor_state == "gave_up" else "starting"
        word = supervisor_message or ("restarting" if restarts else "starting")
        tooltip = f"vramgate: {word}" + (f" · restarts {restarts}" if restarts else "")
        return TrayView(IconView(state, 0.0, 0), tooltip, (tooltip,), restarts=restarts)
    device, queue = status["device"], status["queue"]
    total = max(device["total_bytes"], 1)
    used = device["used_bytes"]
    state = state_of(status, queue_full_delta)
    gpus = status.get("devices") or []
    icon = IconView(
        state, _fullest(gpus) if len(gpus) > 1 else min(1.0, used / total), queue["depth"]
    )
    memory = f"VRAM {_gib(used)} / {_gib(total)} GiB"
    if len(gpus) > 1:  # every GPU's figures: the icon shows the fullest
        memory = (
            " · ".join(f"{g['id']} {_gib(g['used_bytes'])}/{_gib(g['total_bytes'])}" for g in gpus)
            + " GiB"
        )
    tooltip = f"{memory} · {queue['running']} running · {queue['depth']} waiting"
    images = image_steps(status.get("models", []))
    if images:  # the first running image's step: "image 12/30"
        tooltip += " · " + images[0].partition(": ")[2].partition(" (")[0]
        tooltip += f" +{len(images) - 1}" if len(images) > 1 else ""
    if state not in ("ready", "busy"):
        tooltip += f" · {state}"
    if restarts:
        tooltip += f" · restarts {restarts}"
    warnings = tuple(device.get("warnings", ()))
    if warnings:  # the full text is a menu line: a tooltip is cut at 127 characters
        tooltip = (f"⚠ {warnings[0][:60]}… · " + tooltip)[:TOOLTIP_MAX]
    lines = (
        f"{state.capitalize()} on {device['name']}",
        f"VRAM {_gib(used)} of {_gib(total)} GiB (vramgate {_gib(device['used_by_us_bytes'])})",
        f"{queue['running']} running · {queue['depth']} waiting · served "
        f"{status['counters']['served']}",
        *(_device_line(g) for g in (gpus if len(gpus) > 1 else [])),
        *images,
        *(f"⚠ {warning}" for warning in warnings),
    )
    notice = gave_back_notice(status.get("gave_back"))
    if notice is not None:
        lines += (notice.text.removeprefix("vramgate "),)
    models = tuple(
        ModelLine(
            m["name"],
            m["state"],
            m["weights_bytes"],
            m.get("unloads_in_s"),
            m.get("split"),
            m.get("kind", ""),
        )
        for m in status.get("models", [])
    )
    paused = bool(status.get("paused"))
    return TrayView(icon, tooltip, lines, models, paused, restarts, notice)
