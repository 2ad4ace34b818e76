"""What the gate decides about: tickets that wait, permits that run, and its answers.

Plain data: no torch, no asyncio. A ticket's `payload` is its owner's (the scheduler's
job); the gate never looks inside it, and hands it to the group pricer it was given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(eq=False)  # a ticket is itself: finding it in the queue compares identities
class Ticket:
    """A job waiting for admission. `expected_s` is its learned run time."""

    nbytes: int
    deadline: float
    expected_s: float = 0.0
    exclusive: bool = False
    label: str = ""
    enqueued_at: float = 0.0
    bypassed: int = 0
    id: int = field(default=0)
    # Waiting tickets with the same batch key may be admitted together, as one job.
    batch_key: str | None = None
    stream: bool = False  # a generation stream: takes a stream slot where there are some
    batch_limit: int = 1
    owner: str = ""  # what it is for (the model); the gate never reads it
    # A model's own units it holds while it runs (a runner's slots), out of its pool
    # `cell_pool` (see MemoryGate.set_cells); 0: it takes none
    cells: int = 0
    cell_pool: str = ""
    priority: int = 1  # its class (app.sched.priority: 0 first, 1 interactive, 2 background)
    typical: bool = True  # it sizes the background reserve (a model's load does not)
    payload: Any = field(default=None, repr=False)  # the owner's; never read by the gate


@dataclass(frozen=True)
class Permit:
    """The right to run: holds `nbytes` of the pool and one slot until released."""

    ticket_id: int
    nbytes: int
    exclusive: bool
    expected_s: float
    admitted_at: float
    waited_s: float
    members: tuple[int, ...] = ()  # the tickets admitted together, the first one leading
    stream: bool = False  # holds a stream slot, not a job slot
    cells: int = 0  # of its model's pool (Ticket.cells)
    cell_pool: str = ""
    priority: int = 1  # its leader's class, as it was admitted (aged: interactive)
    person: bool = False  # its leader asked for a person's class itself (never by aging)

    @property
    def ticket_ids(self) -> tuple[int, ...]:
        """Every ticket this permit runs, the leader first."""
        return self.members or (self.ticket_id,)


# Every answer of `MemoryGate.submit` carries the permits that call started (`started`):
# the submitted ticket's own, and any waiting ticket's the same decision let in.
@dataclass(frozen=True)
class Admit:
    permit: Permit
    started: tuple[Permit, ...] = ()


@dataclass(frozen=True)
class Wait:
    position: int
    estimated_wait_s: float
    started: tuple[Permit, ...] = ()


@dataclass(frozen=True)
class Reject:
    reason: Literal["queue_full", "exceeds_device"]
    needed: int
    available: int
    queue_depth: int
    estimated_wait_s: float
    started: tuple[Permit, ...] = ()


Decision = Admit | Wait | Reject
