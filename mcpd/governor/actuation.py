"""Applying a policy's targets to each frequency domain.

Every domain keeps its own continuous target, starting from the cap in force and kept inside its
range (the configured [min_mhz, max_mhz] intersected with the hardware range; the hardware range
alone if they do not overlap). The policy moves the target (governors/policy.py); the domain writes
it snapped to its table. Keeping the continuous value is what lets repeated x1.15 steps climb
through a coarse table (RK3588 clusters step by 200 MHz) instead of snapping back to the same level
every time.

A target counts only once written and read back (issue 26): a decision the kernel refuses (EBUSY,
a cap that reads back higher than written) stays wanted, is retried at every decision and shown in
the status, and the next decision steps from the target in force, not from one never written. A
cap that reads back lower than written is in force as read (a kernel limit of its own holds it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from governors.policy import Domain
from mcpd.config import DomainSection
from mcpd.events import Event, EventBus
from mcpd.governor.baseline import Baseline
from mcpd.governor.domains import DomainWriteError, FrequencyDomain
from mcpd.snapshot import WriteFailure
from sensors.episodes import Episodes

log = logging.getLogger("mcpd.governor.actuation")


@dataclass(frozen=True)
class CapChange:
    domain: str
    old_mhz: float | None
    new_mhz: float
    refused_s: float | None = None
    """How long the kernel refused this domain's writes before this one (None: it did not)."""


@dataclass
class DomainControl:
    domain: FrequencyDomain
    low: float
    high: float
    target: float
    """In force: written and read back (the cap it snaps to is the one the kernel shows)."""
    wanted: float | None = None
    """A target decided but not in force yet, retried at every decision."""
    failure: WriteFailure | None = None
    """Why `wanted` is not in force, while its writes fail."""
    changed_at: float | None = None
    """When a decision's write last changed the cap."""

    def want(self, target: float | None) -> None:
        """Decide a target to write (None: the one in force will do, nothing is failing then)."""
        self.wanted = target
        if target is None:
            self.failure = None


def domain_range(
    domain: FrequencyDomain, min_mhz: float, max_mhz: float, override: DomainSection | None
) -> tuple[float, float, bool]:
    """The range a domain moves in, and whether the configured one had to be dropped."""
    if override is not None:
        min_mhz = override.min_mhz if override.min_mhz is not None else min_mhz
        max_mhz = override.max_mhz if override.max_mhz is not None else max_mhz
    low, high = max(min_mhz, domain.min_mhz), min(max_mhz, domain.max_mhz)
    if low >= high:
        return domain.min_mhz, domain.max_mhz, True
    return low, high, False


class Actuators:
    """The governed domains and their targets. Owns their lifecycle: the original cap of every
    domain goes into the baseline when it is adopted, before anything is written to it."""

    def __init__(
        self,
        events: EventBus,
        baseline: Baseline | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.events = events
        self.baseline = baseline
        self.wall = wall
        """Unix time, for when a refusal began (the status shows it)."""
        self.controls: dict[str, DomainControl] = {}
        self._failing: Episodes[str] = Episodes()
        """Domains whose cap writes fail: logged once until a write succeeds."""

    @property
    def failing(self) -> list[str]:
        """The domains whose decided target the kernel does not take."""
        return [name for name, control in self.controls.items() if control.failure is not None]

    @property
    def pending(self) -> bool:
        """Whether some decided target is not in force (the caps are not what was decided)."""
        return any(control.wanted is not None for control in self.controls.values())

    def sync(
        self,
        domains: Iterable[FrequencyDomain],
        min_mhz: float,
        max_mhz: float,
        overrides: Mapping[str, DomainSection],
    ) -> list[CapChange]:
        """Adopt discovered domains (new ones start from their cap), drop vanished ones, apply
        ranges; a cap outside its range is brought inside at once."""
        current: dict[str, DomainControl] = {}
        adopted: list[FrequencyDomain] = []
        for domain in domains:
            override = overrides.get(domain.name)
            if override is not None and not override.enabled:
                continue
            low, high, disjoint = domain_range(domain, min_mhz, max_mhz, override)
            known = self.controls.get(domain.name)
            if disjoint and (known is None or (known.low, known.high) != (low, high)):
                log.warning(
                    "%s: the configured range does not overlap the hardware's %g-%g MHz; using the hardware's",
                    domain.name,
                    domain.min_mhz,
                    domain.max_mhz,
                )
            if known is not None and known.domain.cap_path == domain.cap_path:
                if _shape(known.domain) != _shape(domain):
                    known.domain = domain  # else keep the one whose knobs are open
                known.low, known.high = low, high
                known.target = min(max(known.target, low), high)
                if known.wanted is not None:
                    known.wanted = min(max(known.wanted, low), high)
                current[domain.name] = known
            else:
                cap = domain.read_cap_mhz()
                start = domain.max_mhz if cap is None else cap
                current[domain.name] = DomainControl(domain, low, high, min(max(start, low), high))
                adopted.append(domain)
        self.controls = current
        if self.baseline is not None:
            self.baseline.remember(adopted)
        for domain in adopted:
            domain.open_knobs()
        for control in current.values():
            cap = control.domain.read_cap_mhz()
            if control.wanted is None and (cap is None or not control.low <= cap <= control.high):
                control.want(control.target)
        return self.write_wanted()

    def domains(self) -> tuple[Domain, ...]:
        """The governed domains as a policy sees them."""
        return tuple(
            Domain(name, c.target, c.low, c.high, c.wanted is not None, c.changed_at)
            for name, c in self.controls.items()
        )

    def move(self, targets_mhz: Mapping[str, float], now: float) -> list[CapChange]:
        """A decision at `now`: the named domains to their targets (inside their ranges; the target
        in force needs no write, and drops one still wanted), and every target decided and not in
        force yet written."""
        for name, control in self.controls.items():
            target = targets_mhz.get(name)
            if target is not None:
                target = min(max(target, control.low), control.high)
                control.want(None if target == control.target else target)
        changes = self.write_wanted()
        for change in changes:
            self.controls[change.domain].changed_at = now
        return changes

    def write_wanted(self) -> list[CapChange]:
        """Write every target decided and not in force yet (retried at every decision)."""
        changes = []
        for control in self.controls.values():
            if control.wanted is not None:
                change = self._write(control, control.wanted)
                if change is not None:
                    changes.append(change)
        return changes

    def _write(self, control: DomainControl, wanted: float) -> CapChange | None:
        domain = control.domain
        try:
            old, new = domain.change_cap(wanted, control.low)
        except DomainWriteError as exc:
            since = self.wall() if control.failure is None else control.failure.since
            control.failure = WriteFailure(str(exc), since, wanted)
            if self._failing.fail(domain.name):
                log.error("%s (logged once until a write succeeds; retried at every decision)", exc)
                self.events.publish(
                    Event("fault", str(exc), {"domain": domain.name, "error": "write"})
                )
            return None
        # As written: the continuous target (what lets x1.15 steps climb a coarse table); held
        # lower by the kernel: what it holds.
        exact = new == domain.snap(wanted, control.low) / domain.per_mhz
        control.target = wanted if exact else new
        refused_s = None if control.failure is None else self.wall() - control.failure.since
        control.want(None)
        if self._failing.succeed(domain.name):
            log.info("%s: cap writes work again", domain.name)
            self.events.publish(
                Event(
                    "fault",
                    f"{domain.name}: cap writes work again",
                    {"domain": domain.name, "error": "write", "recovered": True},
                )
            )
        return None if new == old else CapChange(domain.name, old, new, refused_s)


def _shape(domain: FrequencyDomain) -> tuple[int, int, tuple[int, ...]]:
    return domain.hw_min, domain.hw_max, domain.table
