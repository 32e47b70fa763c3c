"""The one interface between the control loop and a policy (issue 28).

A policy is pure: the readings, its state, the time and the governed domains in; a verdict, the
targets it moves domains to and its next state out. The loop keeps the state from one decision to
the next and the actuator writes the targets; neither knows which policy runs, so a new policy
touches neither. The state is the policy's own: the loop only keeps it and hands it back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, Protocol, TypeVar

from governors.levels import DomainSteps

Caps = tuple[tuple[str, float], ...]
"""A set of caps, (domain, MHz) sorted by domain: what a learned power belongs to."""
FullLoadW = Callable[[Mapping[str, float]], float]
"""Where power is estimated (no meter): the board's power at these caps, every domain busy."""


class Action(str, Enum):
    LOWER = "lower"
    RAISE = "raise"
    HOLD = "hold"


@dataclass(frozen=True)
class Readings:
    temp_c: float | None
    """Governing temperature; None = unknown (fail-safe: treated as hot)."""
    power_w: float | None = None
    """Governing power; None = no reading."""
    metered: bool = False
    """Whether the board has a power meter: if it has, a missing power reading is fail-safe."""
    power_estimated: bool = False
    """Whether power_w is the Energy Model estimate (no meter on the board, or `[sensors] power =
    "estimate"`) rather than a meter's reading: it can read a few percent low."""
    temp_at: float | None = field(default=None, compare=False)
    """When temp_c was read (None: now). Not compared: readings are alike when their values are."""
    power_at: float | None = field(default=None, compare=False)
    """When power_w was read (None: now)."""


@dataclass(frozen=True)
class Verdict:
    """Which way the readings say to move, and why."""

    action: Action
    reason: str


@dataclass(frozen=True)
class Decision:
    """A step of one quantity (a domain's target MHz, a model's batch size): what and why."""

    action: Action
    reason: str
    old: float
    new: float

    @property
    def changed(self) -> bool:
        return self.new != self.old


@dataclass(frozen=True)
class Domain:
    """A governed frequency domain as a policy sees it at a decision."""

    name: str
    target_mhz: float
    """In force: written and read back (continuous: the cap is this snapped to the table)."""
    low_mhz: float
    high_mhz: float
    """The range it is governed in."""
    pending: bool = False
    """A target decided before is not in force yet (the kernel refused its write so far)."""
    changed_at: float | None = None
    """When a decision's write last changed its cap."""


StateT = TypeVar("StateT")


@dataclass(frozen=True)
class Step(Generic[StateT]):
    """What a decision does."""

    verdict: Verdict
    targets: Mapping[str, float]
    """Domains to move, by name, to a target in MHz (continuous); the others keep theirs."""
    state: StateT


class Policy(Protocol[StateT]):
    """A policy: its settings are the object, its state is what `decide` hands back."""

    def start(
        self, domains: Sequence[DomainSteps], full_load_w: FullLoadW | None, before: object = None
    ) -> StateT:
        """The state to decide from on `domains`: the first one, or after a reload made this the
        policy (`before`: the state in force until then, of this or another policy)."""
        ...

    def adopt(
        self, state: StateT, domains: Sequence[DomainSteps], full_load_w: FullLoadW | None
    ) -> StateT:
        """`state` on domains that changed (re-discovered, new ranges or tables), keeping what
        still holds."""
        ...

    def decide(
        self, readings: Readings, state: StateT, now: float, domains: Sequence[Domain]
    ) -> Step[StateT]: ...

    def step_batch(self, verdict: Verdict, current_batch: int, max_batch: int) -> Decision:
        """A model's batch size moved with `verdict`."""
        ...

    def learned_w(self, state: StateT) -> Mapping[Caps, float] | None:
        """The power learned at each set of caps, kept across restarts (None: it learns none)."""
        ...

    def seeded(self, state: StateT, peaks: Mapping[Caps, float], now: float) -> StateT:
        """`state` with power learned before a restart, as if reached at `now`."""
        ...
