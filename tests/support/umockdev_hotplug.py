"""Runs under `umockdev-wrapper`: real libudev (through pyudev) sees a umockdev testbed as /sys.

Prints one JSON object with what discovery and the hotplug monitor saw (with `storm`, what a flood
of events costs); test_hotplug.py checks it.
The testbed is driven through libumockdev's C API with ctypes, so no GObject bindings are needed.
"""

from __future__ import annotations

import ctypes
import json
import logging
import select
import sys
import time

from mcpd.governor.rediscovery import RediscoveryTrigger
from sensors import SensorSet
from sensors.hotplug import HotplugMonitor

lib = ctypes.CDLL("libumockdev.so.0")
lib.umockdev_testbed_new.restype = ctypes.c_void_p
lib.umockdev_testbed_add_devicev.restype = ctypes.c_char_p
lib.umockdev_testbed_add_devicev.argtypes = [
    ctypes.c_void_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.POINTER(ctypes.c_char_p),
    ctypes.POINTER(ctypes.c_char_p),
]
lib.umockdev_testbed_uevent.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
lib.umockdev_testbed_remove_device.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


def strv(items: dict[str, str]) -> ctypes.Array[ctypes.c_char_p]:
    flat = [part.encode() for pair in items.items() for part in pair]
    return (ctypes.c_char_p * (len(flat) + 1))(*flat, None)


def wait_for_change(monitor: HotplugMonitor) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if monitor.changed(time.monotonic()):
            return True
        time.sleep(0.01)
    return False


def storm() -> dict[str, object]:
    """A udev storm: 20 add/remove events of one device every 100 ms of the loop's clock for
    3 s, each tick asked whether to re-discover; and 100 events at once read in bounded bites."""
    testbed = lib.umockdev_testbed_new()
    attributes = {"name": "ina3221", "in1_label": "VDD_IN", "in1_input": "5000"}
    ina = lib.umockdev_testbed_add_devicev(
        testbed, b"hwmon", b"hwmon3", None, strv(attributes), strv({})
    )
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("mcpd.sensors").addHandler(handler)
    logging.getLogger("mcpd.sensors").setLevel(logging.INFO)
    monitor = HotplugMonitor.start()
    assert monitor is not None
    trigger = RediscoveryTrigger(monitor, now=0.0)
    reasons = []
    for tick in range(1, 31):
        for n in range(20):
            lib.umockdev_testbed_uevent(testbed, ina, b"remove" if n % 2 else b"add")
        select.select([monitor], [], [], 5)
        reasons.append(trigger.reason(tick / 10, sensors_gone=False, rescan_s=10.0))
    for n in range(100):
        lib.umockdev_testbed_uevent(testbed, ina, b"remove" if n % 2 else b"add")
    select.select([monitor], [], [], 5)
    first = monitor.changed(10.0)
    left = monitor.changed(10.0)
    return {
        "rediscoveries": [i / 10 for i, r in enumerate(reasons, start=1) if r is not None],
        "lines": len(said),
        "said": said[:3],
        "bounded": first and left,
    }


def main() -> None:
    if sys.argv[1:] == ["storm"]:
        print(json.dumps(storm()))
        return
    testbed = lib.umockdev_testbed_new()
    lib.umockdev_testbed_add_devicev(
        testbed,
        b"thermal",
        b"thermal_zone0",
        None,
        strv({"type": "cpu-thermal", "temp": "45000", "mode": "enabled"}),
        strv({}),
    )
    monitor = HotplugMonitor.start()
    assert monitor is not None
    result: dict[str, object] = {"before": [s.name for s in SensorSet.discover("/").powers]}
    result["quiet"] = monitor.changed(time.monotonic())
    ina = lib.umockdev_testbed_add_devicev(
        testbed,
        b"hwmon",
        b"hwmon3",
        None,
        strv(
            {"name": "ina3221", "in1_label": "VDD_IN", "in1_input": "5000", "curr1_input": "1200"}
        ),
        strv({}),
    )
    lib.umockdev_testbed_uevent(testbed, ina, b"add")
    result["add_seen"] = wait_for_change(monitor)
    sensors = SensorSet.discover("/")
    result["after_add"] = {r.name: r.watts for r in sensors.sample_powers(0.0).readings}
    result["temperature"] = sensors.sample_temperatures().celsius
    lib.umockdev_testbed_uevent(testbed, ina, b"remove")
    lib.umockdev_testbed_remove_device(testbed, ina)
    result["remove_seen"] = wait_for_change(monitor)
    result["after_remove"] = [s.name for s in SensorSet.discover("/").powers]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
