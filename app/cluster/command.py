"""The `vramgate cluster` command line. Ray is imported only when the command runs, so
`vramgate --help` works without the `cluster` extra installed."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXTRA_MISSING = (
    "vramgate cluster needs Ray Serve: pip install 'vramgate[cluster]' "
    "(Ray's clusters run on Linux; Windows stays the single-machine server)"
)


def add_parser(
    commands: Any, add_settings_flags: Callable[[argparse.ArgumentParser], None]
) -> None:
    cluster = commands.add_parser(
        "cluster",
        help="serve on a Ray cluster: one replica per GPU behind one address",
        description="Deploys vramgate as a Ray Serve application: one replica of the "
        "whole server per GPU (each with its own gate, queue and learned prices) behind "
        "an ingress on the settings' host and port that sends each request to the "
        "replica with the most free bytes for it. Needs the cluster extra.",
    )
    verbs = cluster.add_subparsers(dest="cluster_command", required=True)
    serve = verbs.add_parser("serve", help="deploy and serve until Ctrl+C")
    serve.add_argument("--config", type=Path, default=None, help="TOML config file")
    serve.add_argument(
        "--address",
        default=None,
        help="the Ray cluster to join (auto: the one `ray start` began on this machine; "
        "ray://HOST:10001 for a remote one; default: start a local one)",
    )
    serve.add_argument(
        "--replicas", type=int, default=None, help="replicas (default: one per GPU, or 1)"
    )
    serve.add_argument(
        "--gpus-per-replica",
        type=float,
        default=1.0,
        help="GPUs each replica takes (default 1; 0 for a CPU or simulated-device cluster)",
    )
    serve.add_argument(
        "--cpus-per-replica", type=float, default=0.0, help="CPUs Ray reserves for each (0)"
    )
    add_settings_flags(serve)


def run(args: argparse.Namespace, settings: Any) -> int:
    try:
        from app.cluster import deploy
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "ray":
            raise SystemExit(EXTRA_MISSING) from None
        raise
    if args.replicas is not None and args.replicas < 1:
        raise SystemExit("--replicas is at least 1")
    shape = deploy.Shape(1, args.gpus_per_replica, args.cpus_per_replica)
    return deploy.run(settings, args.address, args.replicas, shape)
