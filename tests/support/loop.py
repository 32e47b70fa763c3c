"""A control loop on a fake board tree, driven tick by tick by a fake clock: the board with a
power meter most loop tests start from, and its readings set by hand."""

from __future__ import annotations

from pathlib import Path

from mcpd.events import Event, EventBus
from mcpd.governor import board
from mcpd.governor.baseline import Baseline
from mcpd.governor.loop import ControlLoop
from mcpd.governor.loop_settings import LoopSettings
from mcpd.sim import Simulator
from tests.support.boards import RK_A76_KHZ, RK_GPU_HZ, ina3221
from tests.support.clock import FakeClock
from tests.support.fakesys import FakeSysfs

ZONE = "sys/devices/virtual/thermal/thermal_zone0/temp"
INA_CURR = "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1/curr1_input"


def make_loop(
    root: Path, settings: LoopSettings | None = None, **kwargs: object
) -> tuple[ControlLoop, FakeClock, list[Event]]:
    clock = FakeClock(1000.0)
    events = EventBus()
    seen: list[Event] = []
    events.subscribe(seen.append)
    loop = ControlLoop(
        root,
        board.detect(root),
        settings or LoopSettings(),
        events=events,
        baseline=Baseline.load([root / "run/mcpd", root / "state"], root),
        clock=clock,
        wall=lambda: 1.7e9 + clock.now,
        **kwargs,  # type: ignore[arg-type]
    )
    loop.start()
    return loop, clock, seen


def run_for(
    loop: ControlLoop, clock: FakeClock, seconds: float, sim: Simulator | None = None
) -> None:
    """Advance the fake clock to each deadline the loop asks for, stepping the plant in between."""
    end = clock.now + seconds
    wake = clock.now
    while wake <= end:
        if sim is not None:
            sim.advance(wake - clock.now)
        clock.now = wake
        wake = loop.tick(clock.now)


def board_with_meter(fake: FakeSysfs, celsius: float, watts: float) -> None:
    fake.file("proc/sys/kernel/random/boot_id", "0b3a9c2e-0000-4000-8000-000000000000\n")
    fake.zone(0, "soc-thermal", round(celsius * 1000))
    ina3221(
        fake,
        1,
        "1-0040",
        {1: ("VDD_IN", 5000, round(watts * 200)), 2: ("VDD_SOC", 5000, 100), 3: ("NC", 0, 0)},
    )
    fake.cpufreq(4, (4, 5), 408000, 2400000, (*RK_A76_KHZ, 2400000))
    fake.devfreq("fdab0000.npu", "sys/devices/platform/fdab0000.npu", RK_GPU_HZ, "rknpu_ondemand")


def cap(fake: FakeSysfs, rel: str) -> int:
    return int((fake.root / rel).read_text())


def set_temp(fake: FakeSysfs, celsius: float) -> None:
    fake.file(ZONE, f"{round(celsius * 1000)}\n")


def set_power(fake: FakeSysfs, watts: float) -> None:
    fake.file(INA_CURR, f"{round(watts * 200)}\n")
