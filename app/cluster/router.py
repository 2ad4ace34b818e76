"""The ingress's choice of replica: the one with the most free bytes for the request.

Each replica reports its own figures to Ray Serve (`Replica.record_routing_stats`: for
each model it serves, the bytes its device's gate could admit now and the model's
typical price). Those figures are a moment old when a request is routed, and a burst
would all go to the replica that looked best then; so the router also counts the
requests it has in flight to each replica (sent, not yet finished) and takes each one's
typical price off that replica's free bytes: conservative, as the running ones among
them are already out of the figures. `rank` is the pure decision; `FreeBytesRouter` is
Ray Serve's extension point around it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from app.cluster import registry  # by attribute: see app.cluster.registry


def free_for(stats: Mapping[str, Any], model: str | None, in_flight: int) -> int:
    """What a replica could admit for `model` now, less its in-flight requests × the
    model's typical price; -1: it does not serve `model`."""
    models = stats.get("models", {})
    if model is None:  # not an inference request: the replica's own free bytes
        return int(stats.get("free_bytes", 0)) - in_flight
    if model not in models:
        return -1
    figures = models[model]
    return int(figures["free_bytes"]) - in_flight * int(figures.get("price_bytes", 0))


def rank(
    replicas: Sequence[tuple[str, Mapping[str, Any], int]],
    model: str | None,
    avoid: Sequence[str] = (),
) -> list[str]:
    """Replica ids, best first: (id, its reported figures, requests in flight to it).
    Replicas that do not serve the model come last, those to avoid (they refused this
    request already) after them; more free bytes first, then fewer in flight; a
    replica that reported nothing yet ranks as having none free."""

    def key(item: tuple[str, Mapping[str, Any], int]) -> tuple[bool, bool, int, int]:
        replica, stats, in_flight = item
        free = free_for(stats, model, in_flight)
        return (replica in avoid, free < 0, -free, in_flight)

    return [replica for replica, _, _ in sorted(replicas, key=key)]


class FreeBytesRouter(RequestRouter):
    """Routes by `rank`. The call's keyword arguments say what it is: `model` (None for
    a request that is not inference), `avoid` (replica ids that refused it already),
    `pin` (exactly this replica: the cluster's /status asks each one)."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._in_flight: Counter[ReplicaID] = Counter()
        registry.ROUTERS.add(self)

    def replica_figures(self) -> list[tuple[str, dict[str, Any]]]:
        """Each replica's id and its last reported figures."""
        return [(r.replica_id.unique_id, dict(r.routing_stats)) for r in self._replicas.values()]

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        kwargs = pending_request.kwargs if pending_request is not None else {}
        pin = kwargs.get("pin")
        if pin is not None:
            return [[r for r in candidate_replicas if r.replica_id.unique_id == pin]]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        rows = [
            (unique, r.routing_stats, self._in_flight[r.replica_id]) for unique, r in by_id.items()
        ]
        order = rank(rows, kwargs.get("model"), tuple(kwargs.get("avoid", ())))
        return [[by_id[unique]] for unique in order]  # each rank tried in turn

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        self._in_flight[replica_id] += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        # by replica, not by request id: the calls one ingress request makes share its id
        self._in_flight[replica_id] = max(0, self._in_flight[replica_id] - 1)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._in_flight.pop(replica_id, None)
