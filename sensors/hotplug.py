"""Hotplug: udev add/remove events for sensors and frequency domains trigger re-discovery.

Only meaningful on a real root: a fake tree (the simulator, tests) has no udev, so the caller
re-discovers when a sensor file vanishes instead. The monitor is polled without blocking from the
control loop, which keeps one thread and no callbacks.

A storm of events (a flapping I2C device, a script rebinding a driver in a loop; issue 26) must
not cost the loop more than a bounded bite per tick: at most MAX_EVENTS_PER_POLL are read per
call (the rest wait for the next one, or overflow the socket, which is read as a change too),
and each kind of event is logged once per LOG_EVERY_S with how many went unsaid. Re-discovering
at most once a second is the caller's part (mcpd.governor.rediscovery).
"""

from __future__ import annotations

import logging
from typing import Any

from sensors.episodes import Repeats

log = logging.getLogger("mcpd.sensors")

SUBSYSTEMS = ("thermal", "hwmon", "powercap", "devfreq")
MAX_EVENTS_PER_POLL = 32
LOG_EVERY_S = 10.0


class HotplugMonitor:
    def __init__(self, monitor: Any) -> None:
        self._monitor = monitor
        self._said: Repeats[str] = Repeats(LOG_EVERY_S)

    @classmethod
    def start(cls, subsystems: tuple[str, ...] = SUBSYSTEMS) -> HotplugMonitor | None:
        """A started monitor, or None where udev is not available (containers, no libudev)."""
        try:
            import pyudev

            monitor = pyudev.Monitor.from_netlink(pyudev.Context())
            for subsystem in subsystems:
                monitor.filter_by(subsystem)
            monitor.start()
        except (ImportError, OSError) as exc:
            log.warning("udev hotplug events unavailable (%s); relying on vanished files", exc)
            return None
        return cls(monitor)

    def fileno(self) -> int:
        """Readable when events are pending."""
        fileno: int = self._monitor.fileno()
        return fileno

    def changed(self, now: float) -> bool:
        """Read at most MAX_EVENTS_PER_POLL pending events without blocking; True if a device
        was added, removed or moved, or events were lost."""
        changed = False
        for _ in range(MAX_EVENTS_PER_POLL):
            try:
                device = self._monitor.poll(timeout=0)
            except OSError as exc:  # ENOBUFS: the kernel dropped events the socket had no room for
                self._say("lost", f"hotplug: events lost ({exc.strerror}); looking again", now)
                return True
            if device is None:
                break
            if device.action in ("add", "remove", "move"):
                self._say(device.action, f"hotplug: {device.action} {device.sys_path}", now)
                changed = True
        return changed

    def _say(self, kind: str, message: str, now: float) -> None:
        unsaid = self._said.say(kind, now)
        if unsaid:
            log.info("%s (%d more since, not logged)", message, unsaid)
        elif unsaid is not None:
            log.info("%s", message)
