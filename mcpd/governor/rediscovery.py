"""When to look for sensors and frequency domains again, and whether there is anything to govern.

Udev add/remove events (on a real root), a sensor file that vanished, or a periodic rescan where no
udev monitor runs (fake trees, containers) each trigger re-discovery. Events and vanished files
re-discover at most once a second (a re-discovery costs milliseconds): a storm of udev events is
one re-discovery a second for as long as it lasts, and an event inside that second is kept for the
next, never lost (issue 26).
"""

from __future__ import annotations

from pathlib import Path

from mcpd.events import Event
from mcpd.governor import reports
from sensors.episodes import Episodes
from sensors.hotplug import HotplugMonitor

MIN_RESCAN_S = 1.0
"""The shortest interval between re-discoveries for udev events or a vanished file (a file stays
vanished a while; a flapping device sends events without end)."""


class RediscoveryTrigger:
    def __init__(self, hotplug: HotplugMonitor | None, now: float) -> None:
        self.hotplug = hotplug
        self._last_scan = now
        self._udev_pending = False
        """Events came since the last re-discovery."""

    def reason(self, now: float, sensors_gone: bool, rescan_s: float) -> str | None:
        """Why to re-discover at `now`, or None; a reason starts the next interval."""
        if self.hotplug is not None and self.hotplug.changed(now):
            self._udev_pending = True
        due = now - self._last_scan >= MIN_RESCAN_S
        hotplug = due and self._udev_pending
        vanished = due and sensors_gone
        periodic = self.hotplug is None and now - self._last_scan >= rescan_s
        if not (hotplug or vanished or periodic):
            return None
        self._last_scan = now
        self._udev_pending = False
        if hotplug:
            return "udev event"
        return "a sensor file vanished" if vanished else "devices changed"


class Governability:
    """Said loudly, once per change: a daemon that only says "ready" with nothing to govern by or
    nothing to govern would leave the board unprotected unnoticed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.missing: tuple[str, ...] = ()
        """What governing lacks ("temperature sensor", "frequency domain")."""
        self._lacking: Episodes[str] = Episodes(say_changes=True)

    def check(self, temperature_sensors: bool, domains: bool) -> Event | None:
        """The event to say when what is missing changed (the first check says only a lack)."""
        absent = (
            ("temperature sensor", not temperature_sensors),
            ("frequency domain", not domains),
        )
        self.missing = tuple(what for what, lacking in absent if lacking)
        if self.missing:
            said = self._lacking.fail("governing", " and ".join(self.missing))
        else:
            said = self._lacking.succeed("governing")
        return reports.ungoverned(self.root, self.missing, domains) if said else None
