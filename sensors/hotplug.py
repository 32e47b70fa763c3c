"""Hotplug: udev add/remove events for sensors and frequency domains trigger re-discovery.

Only meaningful on a real root: a fake tree (the simulator, tests) has no udev, so the caller
re-discovers when a sensor file vanishes instead. The monitor is polled without blocking from the
control loop, which keeps one thread and no callbacks.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("mcpd.sensors")

SUBSYSTEMS = ("thermal", "hwmon", "powercap", "devfreq")


class HotplugMonitor:
    def __init__(self, monitor: Any) -> None:
        self._monitor = monitor

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

    def changed(self) -> bool:
        """Drain pending events without blocking; True if any device was added or removed."""
        changed = False
        while True:
            device = self._monitor.poll(timeout=0)
            if device is None:
                return changed
            if device.action in ("add", "remove", "move"):
                log.info("hotplug: %s %s", device.action, device.sys_path)
                changed = True
