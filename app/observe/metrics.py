"""Prometheus metrics (one registry per server) and the counters /status shows."""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, disable_created_metrics
from prometheus_client import Counter as PromCounter

disable_created_metrics()  # no `*_created` series: they double the families for no use

LATENCY_WINDOW = 2048
_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Metrics:
    """Names are listed in docs/metrics-logs.md; labels are bounded (model names, error codes, the
    server's device ids)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._request_series(self.registry)
        self._device_gauges(self.registry)
        self.ready = Gauge("vramgate_ready", "1 when the server is ready", registry=self.registry)
        # For /status: plain counters and a window of recent latencies.
        self.served: Counter[str] = Counter()
        self.served_by_device: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.oom_count = 0
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._success: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    def _request_series(self, r: CollectorRegistry) -> None:
        """What requests did: served, refused, out of memory, waits and run times."""
        self.requests = PromCounter(
            "vramgate_requests",
            "Requests by model, outcome and the device that served them",
            ["model", "outcome", "device"],
            registry=r,
        )
        self.rejections = PromCounter(
            "vramgate_rejections", "Requests refused or failed, by reason", ["reason"], registry=r
        )
        self.ooms = PromCounter(
            "vramgate_oom", "Out-of-memory errors during a job", ["device"], registry=r
        )
        self.evictions = PromCounter(
            "vramgate_evictions",
            "Models unloaded by vramgate, by reason",
            ["reason", "device"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "vramgate_queue_wait_seconds",
            "Time spent waiting for admission",
            ["model"],
            buckets=_TIME_BUCKETS,
            registry=r,
        )
        self.run_time = Histogram(
            "vramgate_run_seconds",
            "Time on the device",
            ["model"],
            buckets=_TIME_BUCKETS,
            registry=r,
        )

    def _device_gauges(self, r: CollectorRegistry) -> None:
        """What each device holds now, and the learned prices."""

        def per_device(name: str, text: str) -> Gauge:
            return Gauge(name, text, ["device"], registry=r)

        self.queue_depth = per_device("vramgate_queue_depth", "Jobs waiting")
        self.queue_depth_by_class = Gauge(
            "vramgate_queue_depth_by_class",
            "Jobs waiting, by class (priority, interactive, background)",
            ["device", "priority"],
            registry=r,
        )
        self.oldest_wait_by_class = Gauge(
            "vramgate_queue_oldest_wait_seconds",
            "The longest wait now, by class",
            ["device", "priority"],
            registry=r,
        )
        self.running = per_device("vramgate_running_jobs", "Jobs on the device")
        self.pool = per_device("vramgate_pool_bytes", "Bytes jobs may hold in total now")
        self.admitted = per_device("vramgate_admitted_bytes", "Bytes held by running jobs")
        self.device_total = per_device("vramgate_device_total_bytes", "Device memory")
        self.device_used = per_device(
            "vramgate_device_used_bytes", "Device memory in use by all processes"
        )
        self.device_ours = per_device(
            "vramgate_device_ours_bytes", "Device memory held by this server"
        )
        self.prefix_bytes = per_device(
            "vramgate_prefix_cache_bytes", "Bytes the prefix cache holds (reclaimable)"
        )
        self.prefix_entries = per_device(
            "vramgate_prefix_cache_entries", "Ended generations kept in the prefix cache"
        )
        self.prefix_lookups = per_device(
            "vramgate_prefix_cache_lookups", "Generations that looked for a cached prefix"
        )
        self.prefix_hits = per_device(
            "vramgate_prefix_cache_hits", "Generations that reused a cached prefix"
        )
        self.prefix_tokens = per_device(
            "vramgate_prefix_cache_reused_tokens", "Prompt tokens not prefilled thanks to it"
        )
        self._speculation_gauges(r)
        self.price = Gauge(
            "vramgate_price_bytes",
            "Learned price per bucket",
            ["model", "bucket", "device"],
            registry=r,
        )

    def _speculation_gauges(self, r: CollectorRegistry) -> None:
        """Each GGUF model's speculative decoding (app.engines.llama_cpp.draft_meter)."""
        self._speculative_kinds: dict[str, str] = {}  # each model's kind label now
        self.speculative_on = Gauge(
            "vramgate_speculative_on",
            "1 when the model's runner speculates (its next load's, while unloaded)",
            ["model", "kind"],
            registry=r,
        )
        self.speculative_drafted = Gauge(
            "vramgate_speculative_draft_tokens",
            "Tokens drafted for the model's requests since the server started",
            ["model"],
            registry=r,
        )
        self.speculative_accepted = Gauge(
            "vramgate_speculative_accepted_tokens",
            "Drafted tokens its own sampling accepted",
            ["model"],
            registry=r,
        )

    def set_speculation(self, rows: list[dict[str, Any]]) -> None:
        """The speculation gauges from /status' model rows (those that have one)."""
        for row in rows:
            found = row.get("speculative")
            if not isinstance(found, dict):
                continue
            name, kind = str(row["name"]), str(found.get("kind") or "none")
            before = self._speculative_kinds.get(name)
            if before is not None and before != kind:  # its old kind's series is gone
                self.speculative_on.remove(name, before)
            self._speculative_kinds[name] = kind
            self.speculative_on.labels(name, kind).set(1 if found.get("on") else 0)
            self.speculative_drafted.labels(name).set(found.get("drafted_tokens") or 0)
            self.speculative_accepted.labels(name).set(found.get("accepted_tokens") or 0)

    def observe_success(
        self, model: str, wait_s: float, run_s: float, total_s: float, device: str = ""
    ) -> None:
        children = self._success.get((model, device))
        if children is None:  # a labelled child is looked up once per model, not per call
            children = self._success[model, device] = (
                self.requests.labels(model, "ok", device),
                self.queue_wait.labels(model),
                self.run_time.labels(model),
            )
        served, queue_wait, run_time = children
        served.inc()
        queue_wait.observe(wait_s)
        run_time.observe(run_s)
        self.served[model] += 1
        self.served_by_device[device] += 1
        self.latencies.append(total_s)

    def observe_failure(self, model: str, reason: str, device: str = "") -> None:
        self.requests.labels(model, reason, device).inc()
        self.rejections.labels(reason).inc()
        self.rejected[reason] += 1

    def observe_refusal(self, reason: str) -> None:
        """A request refused before it named a model the server knows (a bad body, an
        unknown route, a foreign origin, ...): counted by reason alone."""
        self.rejections.labels(reason).inc()
        self.rejected[reason] += 1

    def observe_oom(self, device: str = "") -> None:
        self.ooms.labels(device).inc()
        self.oom_count += 1

    def latency_summary(self) -> dict[str, float]:
        values = list(self.latencies)
        return {
            "count": len(values),
            "p50_s": round(percentile(values, 0.50), 6),
            "p95_s": round(percentile(values, 0.95), 6),
            "p99_s": round(percentile(values, 0.99), 6),
        }
