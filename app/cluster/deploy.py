"""`vramgate cluster serve`: deploy vramgate on a Ray cluster and serve until stopped.

Connects to the Ray cluster at `--address` (or starts a local one), deploys one replica
per GPU (`num_gpus` each; Ray places them on the machines that have them) behind one
ingress on the settings' host and port, and waits; Ctrl+C or SIGTERM takes the
application down (and the local Ray instance, if it started one).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass
from types import FrameType
from typing import Any

import ray
from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from app.cluster.ingress import Ingress
from app.cluster.replica import Replica
from app.cluster.router import FreeBytesRouter
from app.config.settings import Settings

log = logging.getLogger("vramgate.cluster")

APP_NAME = "vramgate"
STATS_PERIOD_S = 0.5  # how often each replica reports its free bytes to the router


@dataclass(frozen=True)
class Shape:
    """How many replicas, and what each takes of a machine."""

    replicas: int
    gpus_per_replica: float = 1.0
    cpus_per_replica: float = 0.0


def application(settings: Settings, shape: Shape) -> Application:
    """The Ray Serve application: `shape.replicas` replicas of the whole server behind
    the ingress. A replica admits what its own gate admits: Ray queues nothing before it
    (`max_ongoing_requests` above the replica's own queue and slots)."""
    routing: dict[str, Any] = {
        "request_router_class": FreeBytesRouter,
        "request_routing_stats_period_s": STATS_PERIOD_S,
        "request_routing_stats_timeout_s": 5,
    }
    replica: Any = serve.deployment(
        Replica,
        name="Replica",
        num_replicas=shape.replicas,
        ray_actor_options={"num_gpus": shape.gpus_per_replica, "num_cpus": shape.cpus_per_replica},
        max_ongoing_requests=settings.max_queue + 512,
        request_router_config=RequestRouterConfig(**routing),
        health_check_period_s=5,
    )
    ingress: Any = Ingress  # a Deployment once decorated (Ray's stubs say otherwise)
    return ingress.bind(replica.bind(settings), int(settings.max_body_bytes))  # type: ignore[no-any-return]


def default_replicas(gpus_per_replica: float) -> int:
    """One replica per GPU of the cluster (one, on a cluster with none)."""
    gpus = float(ray.cluster_resources().get("GPU", 0))
    if gpus_per_replica <= 0 or gpus < gpus_per_replica:
        return 1
    return int(gpus // gpus_per_replica)


# Ray Serve's controller gives a starting HTTP proxy 5 s to say it is ready, then kills it
# and `serve.start` fails with ActorDiedError (ray/serve/_private/constants.py,
# PROXY_READY_CHECK_TIMEOUT_S): seen on a 2-core machine busy with other work. A Ray this
# command starts gives it a minute; a cluster of its own keeps its own setting.
PROXY_READY_ENV, PROXY_READY_S = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60"


def run(settings: Settings, address: str | None, replicas: int | None, shape: Shape) -> int:
    """Deploy and serve until a signal; returns the exit code."""
    started_here = address is None
    if started_here:  # the Ray it starts: its processes take this environment
        os.environ.setdefault(PROXY_READY_ENV, PROXY_READY_S)
    ray.init(address=address, include_dashboard=False, configure_logging=False)
    count = replicas if replicas is not None else default_replicas(shape.gpus_per_replica)
    shape = Shape(count, shape.gpus_per_replica, shape.cpus_per_replica)
    serve.start(
        proxy_location="HeadOnly", http_options={"host": settings.host, "port": settings.port}
    )
    serve.run(application(settings, shape), name=APP_NAME, route_prefix="/")
    url = f"http://{settings.host}:{settings.port}"
    log.info(
        "vramgate cluster: %d replica(s), %s GPU each, on %s", count, shape.gpus_per_replica, url
    )
    print(f"vramgate cluster serving on {url} ({count} replicas)", flush=True)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop.wait()
    except (KeyboardInterrupt, SystemExit):  # Ray's own handler, where it took the signal
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            serve.delete(APP_NAME)
        except TimeoutError as exc:  # Ray Serve's own bound (60 s); its controller goes on
            log.warning("the application is still being deleted: %s", exc)
        if started_here:
            serve.shutdown()
        ray.shutdown()  # a cluster it joined (--address) goes on: this only disconnects
    print("vramgate cluster stopped", flush=True)
    return 0
