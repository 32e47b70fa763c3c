"""Applying the governor to each frequency domain.

Every domain keeps its own continuous target, starting from the cap in force and kept inside its
range (the configured [min_mhz, max_mhz] intersected with the hardware range; the hardware range
alone if they do not overlap). The governor steps the target; the domain writes it snapped to its
table. Keeping the continuous value is what lets repeated x1.15 steps climb through a coarse table
(RK3588 clusters step by 200 MHz) instead of snapping back to the same level every time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from governors import Action, HysteresisGovernor, Verdict
from mcpd.config import DomainSection
from mcpd.events import Event, EventBus
from mcpd.governor.baseline import Baseline
from mcpd.governor.domains import DomainWriteError, FrequencyDomain
from sensors.episodes import Episodes

log = logging.getLogger("mcpd.governor.actuation")


@dataclass(frozen=True)
class CapChange:
    domain: str
    old_mhz: float | None
    new_mhz: float


@dataclass
class DomainControl:
    domain: FrequencyDomain
    low: float
    high: float
    target: float


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

    def __init__(self, events: EventBus, baseline: Baseline | None = None) -> None:
        self.events = events
        self.baseline = baseline
        self.controls: dict[str, DomainControl] = {}
        self._failing: Episodes[str] = Episodes()
        """Domains whose cap writes fail: logged once until a write succeeds."""

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
        changes = []
        for control in current.values():
            cap = control.domain.read_cap_mhz()
            if cap is None or not control.low <= cap <= control.high:
                change = self._write(control)
                if change is not None:
                    changes.append(change)
        return changes

    def apply(self, governor: HysteresisGovernor, verdict: Verdict) -> list[CapChange]:
        changes: list[CapChange] = []
        if verdict.action is Action.HOLD:
            return changes
        for control in self.controls.values():
            decision = governor.step_mhz(verdict, control.target, control.low, control.high)
            if not decision.changed:
                continue
            control.target = decision.new
            change = self._write(control)
            if change is not None:
                changes.append(change)
        return changes

    def set_targets(self, targets_mhz: Mapping[str, float]) -> list[CapChange]:
        """Move the named domains to the given targets (a policy that picks caps itself)."""
        changes: list[CapChange] = []
        for name, control in self.controls.items():
            target = targets_mhz.get(name)
            if target is None or target == control.target:
                continue
            control.target = min(max(target, control.low), control.high)
            change = self._write(control)
            if change is not None:
                changes.append(change)
        return changes

    def _write(self, control: DomainControl) -> CapChange | None:
        domain = control.domain
        try:
            old, new = domain.change_cap(control.target, control.low)
        except DomainWriteError as exc:
            if self._failing.fail(domain.name):
                log.error("%s (logged once until a write succeeds)", exc)
                self.events.publish(
                    Event("fault", str(exc), {"domain": domain.name, "error": "write"})
                )
            return None
        if self._failing.succeed(domain.name):
            log.info("%s: cap writes work again", domain.name)
        return None if new == old else CapChange(domain.name, old, new)


def _shape(domain: FrequencyDomain) -> tuple[int, int, tuple[int, ...]]:
    return domain.hw_min, domain.hw_max, domain.table
