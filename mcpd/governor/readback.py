"""The clocks in force, read back from the domains: the cap and current frequency of each, and caps
another program changed behind mcpd's back (followed, not fought: mcpd.governor.competitors)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mcpd.events import EventBus
from mcpd.governor import competitors
from mcpd.governor.actuation import CapChange, DomainControl


class Readback:
    def __init__(self, events: EventBus) -> None:
        self.events = events
        self.caps: dict[str, float | None] = {}
        """The cap in force per domain: what was read back, or what mcpd wrote since."""
        self.curs: dict[str, float | None] = {}
        self.external_changes = 0
        """Caps found changed by another program since start."""

    def wrote(self, changes: Iterable[CapChange]) -> None:
        for change in changes:
            self.caps[change.domain] = change.new_mhz

    def read(self, controls: Mapping[str, DomainControl]) -> None:
        """Read every domain's cap and current clock; a cap that is not what mcpd left there is
        reported and its domain's target follows it."""
        expected = self.caps
        self.caps = {name: c.domain.read_cap_mhz() for name, c in controls.items()}
        self.external_changes += competitors.follow_external_caps(
            controls, expected, self.caps, self.events
        )
        self.curs = {name: c.domain.read_cur_mhz() for name, c in controls.items()}
