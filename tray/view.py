"""What the tray shows, derived from one /status document and the supervisor's state.

Pure: no display, no HTTP. The icon is redrawn only when `IconView` changes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tray.start_failures import StartFailure

# starting: the server is not ready yet (or restarting); error: it failed or gave up.
STATES = ("starting", "ready", "busy", "overloaded", "paused", "error")
OVERLOADED_QUEUE_SHARE = 0.8
GiB = 2**30
# The icon's gauge is 51 pixels high (tray.icon.gauge_box at 64 px): the VRAM fraction is
# kept to that resolution, so a figure that moves less than a pixel redraws nothing.
GAUGE_STEPS = 51
# A model's keep-alive end, computed at each poll as the poll's time plus /status'
# `unloads_in_s`, moves by the poll's own jitter (milliseconds): within this it is the
# same end, and the menu keeps its line.
DEADLINE_SLACK_S = 2.0


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
    unloads_at: str | None = None  # idle: when its keep-alive ends, to the minute ("14:32")
    split: str | None = None  # a GGUF's layers between CPU and GPU ("48%/52% CPU/GPU")
    # that end in epoch seconds; not compared: the menu shows `unloads_at`, which a
    # countdown changes once a minute at most, where `unloads_in_s` changes every poll
    deadline: float | None = field(default=None, compare=False)
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


def gave_up_view(failure: StartFailure, reason: str, restarts: int) -> TrayView:
    """The server could not start, for a known cause: the cause and a short fix in the
    tooltip, the whole fix in the menu and once as a notification."""
    tooltip = f"vramgate stopped: {failure.cause}; {failure.hint}"[:TOOLTIP_MAX]
    lines = (f"Stopped: {failure.cause}", f"Fix: {failure.fix}", f"({reason})")
    notice = Notice(float(restarts), f"vramgate stopped: {failure.text()}")
    return TrayView(IconView("error", 0.0, 0), tooltip, lines, restarts=restarts, notice=notice)


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


def gauge_fraction(fraction: float) -> float:
    """`fraction` (0..1) to the gauge's resolution."""
    return round(max(0.0, min(1.0, fraction)) * GAUGE_STEPS) / GAUGE_STEPS


def load_words(models: list[dict[str, Any]]) -> list[str]:
    """Each loading model's progress as its /status row's `load` says it: "loading qwen3
    41%" where its fraction is known, else its seconds so far ("loading qwen3 3 s"), or
    "waiting for memory"."""
    said = []
    for model in models:
        load = model.get("load")
        if model.get("state") != "loading" or not load:
            continue
        if load.get("fraction") is not None:
            said.append(f"loading {model['name']} {load['fraction'] * 100:.0f}%")
        elif load.get("elapsed_s") is not None:
            said.append(f"loading {model['name']} {load['elapsed_s']:.0f} s")
        else:
            said.append(f"{model['name']} {load['phase']}")
    return said


def model_line(model: dict[str, Any], now: float, previous: ModelLine | None) -> ModelLine:
    """A /status model as the menu shows it: its keep-alive left as the clock time it ends
    (a menu is not redrawn while open, and a countdown would rebuild it at every poll)."""
    left = model.get("unloads_in_s")
    deadline = None if left is None else now + left
    if (
        deadline is not None
        and previous is not None
        and previous.deadline is not None
        and abs(deadline - previous.deadline) < DEADLINE_SLACK_S
    ):
        deadline = previous.deadline
    at = None if deadline is None else time.strftime("%H:%M", time.localtime(deadline))
    return ModelLine(
        model["name"],
        model["state"],
        model["weights_bytes"],
        at,
        model.get("split"),
        deadline,
        model.get("kind", ""),
    )


def view_of(
    status: dict[str, Any] | None,
    *,
    supervisor_state: str = "running",
    supervisor_message: str = "",
    restarts: int = 0,
    queue_full_delta: int = 0,
    now: float | None = None,
    previous: TrayView | None = None,
    failure: StartFailure | None = None,
) -> TrayView:
    """The tray's view; `status` None means the server is not answering (yet). `now`: the
    poll's wall-clock time; `previous`: the last view, whose keep-alive ends are kept while
    they agree with this poll's. `failure`: a known cause read from the server's output,
    said with its fix once the supervisor gave up."""
    if supervisor_state == "gave_up" and failure is not None:
        return gave_up_view(failure, supervisor_message, restarts)
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
    fraction = _fullest(gpus) if len(gpus) > 1 else used / total
    icon = IconView(state, gauge_fraction(fraction), queue["depth"])
    memory = f"VRAM {_gib(used)} / {_gib(total)} GiB"
    if len(gpus) > 1:  # every GPU's figures: the icon shows the fullest
        memory = (
            " · ".join(f"{g['id']} {_gib(g['used_bytes'])}/{_gib(g['total_bytes'])}" for g in gpus)
            + " GiB"
        )
    tooltip = f"{memory} · {queue['running']} running · {queue['depth']} waiting"
    background = queue.get("by_class", {}).get("background", {}).get("waiting", 0)
    if background:  # of those waiting, how many may wait (a batch, an app's tasks)
        tooltip += f" ({background} background)"
    images = image_steps(status.get("models", []))
    if images:  # the first running image's step: "image 12/30"
        tooltip += " · " + images[0].partition(": ")[2].partition(" (")[0]
        tooltip += f" +{len(images) - 1}" if len(images) > 1 else ""
    loading = load_words(status.get("models", []))
    if loading:  # the first loading model's progress: "loading qwen3 41%"
        tooltip += " · " + loading[0] + (f" +{len(loading) - 1}" if len(loading) > 1 else "")
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
    now = time.time() if now is None else now
    before = {m.name: m for m in previous.models} if previous is not None else {}
    models = tuple(model_line(m, now, before.get(m["name"])) for m in status.get("models", []))
    paused = bool(status.get("paused"))
    return TrayView(icon, tooltip, lines, models, paused, restarts, notice)
