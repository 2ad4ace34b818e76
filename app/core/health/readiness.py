"""Readiness and the watchdog: when work last completed, and threads that do not come
back. A wedged device stops completions; /health turns unhealthy at once, and if a
thread is still not back after another `run_timeout`, the process ends (exit 76) so the
supervisor starts a fresh one. Work that runs in a process of its own (a llama.cpp
runner) is no thread of ours: its silence ends that process instead (the scheduler asks
its model, `stalled`), and the server lives on."""

from __future__ import annotations

from collections.abc import Callable

from app.config.settings import Settings
from app.core.scheduler import Scheduler
from app.core.state import ServerState
from app.errors import EXIT_WEDGED


class Health:
    def __init__(
        self,
        state: ServerState,
        scheduler: Scheduler,
        settings: Settings,
        clock: Callable[[], float],
        on_wedged: Callable[[BaseException, int], None],
    ) -> None:
        self._state = state
        self._scheduler = scheduler
        self._settings = settings
        self._clock = clock
        self._on_wedged = on_wedged
        self.last_alive = clock()  # when a job last completed: a wedged device stops this
        self.wedged_since: float | None = None

    def alive(self) -> None:
        """A job completed."""
        self.last_alive = self._clock()

    def needs_probe(self, seconds: float) -> bool:
        """Whether a probe would tell anything: no job completed in the last `seconds`,
        and none runs now (running work has the watchdog, and a probe beside a long
        prefill would only wait behind it)."""
        idle = not self._scheduler.running_models()
        return idle and self._clock() - self.last_alive >= seconds

    @property
    def ready(self) -> bool:
        stale_after = 3 * self._settings.health_interval + self._settings.queue_timeout
        fresh = self._clock() - self.last_alive < stale_after
        return self._state.phase == "ready" and fresh and not self._scheduler.wedged

    def watchdog(self) -> None:
        """Runs without progress for `run_timeout` get 504 and their permits back."""
        now, limit = self._clock(), self._settings.run_timeout
        if self._scheduler.watch(now, limit) and self.wedged_since is None:
            self.wedged_since = now
        if not self._scheduler.wedged:
            self.wedged_since = None
        elif self.wedged_since is not None and now - self.wedged_since > limit:
            error = RuntimeError(f"an inference thread has not come back for {2 * limit:g}s")
            self._on_wedged(error, EXIT_WEDGED)
