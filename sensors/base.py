"""Sensor kinds shared by the adapters, and the plausibility rules applied to every reading."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from sensors.sysfs import Attribute

# Outside this range a "temperature" is a sentinel or a broken sensor, never the die: Jetson reports
# -256000 m°C for power-gated zones, thermal trips use -32768000 placeholders (docs/sysfs.md §6.2).
TEMP_MIN_C = -40.0
TEMP_MAX_C = 150.0

_MILLI_MIN = round(TEMP_MIN_C * 1000)
_MILLI_MAX = round(TEMP_MAX_C * 1000)

# A Jetson zone reads this while its engine is power-gated (the GPU whenever it idles): no
# temperature to govern on, and no fault either, or an idle-busy GPU is an outage a second.
_GATED_MILLI = -256000

# Far above any board mcpd runs on; a larger delta means a counter reset, not power.
POWER_MAX_W = 2000.0

# Rails that measure what the whole board draws, most preferred first (jtop's order: Thor INA238
# `VIN`, JetPack 4 `POM_5V_IN`, Orin Nano/NX and Xavier NX `VDD_IN`; docs/sysfs.md §1).
INPUT_RAILS = ("VIN", "POM_5V_IN", "VDD_IN")

PowerRole = Literal["input", "rail", "package", "subzone", "other"]
"""How a power sensor relates to the board: `input` measures what the board draws (Jetson VDD_IN,
POM_5V_IN, RAPL psys); `rail` is one supply rail; `package`/`subzone` are RAPL domains."""


@dataclass(frozen=True)
class TemperatureReading:
    name: str
    source: str
    celsius: float | None


@dataclass(frozen=True)
class PowerReading:
    name: str
    source: str
    watts: float | None


class TemperatureSensor:
    """A temperature attribute in millidegrees Celsius (thermal zone `temp`, hwmon `tempN_input`)."""

    __slots__ = ("attr", "attributes", "governs", "name", "source")

    def __init__(self, name: str, source: str, attr: Attribute, *, governs: bool) -> None:
        self.name = name
        self.source = source
        self.attr = attr
        self.attributes = (attr,)
        self.governs = governs

    def __repr__(self) -> str:
        return f"TemperatureSensor({self.name!r}, {self.source!r}, governs={self.governs})"

    def read(self) -> float | None:
        millidegrees = self.attr.read_int(_MILLI_MIN, _MILLI_MAX, absent=_GATED_MILLI)
        return None if millidegrees is None else millidegrees / 1000.0

    def sample(self) -> TemperatureReading:
        return TemperatureReading(self.name, self.source, self.read())


class PowerSensor(Protocol):
    name: str
    source: str
    role: PowerRole

    @property
    def attributes(self) -> tuple[Attribute, ...]:
        """The files it reads."""
        ...

    def read(self, now: float) -> float | None:
        """Watts at monotonic time `now` (seconds), or None when unavailable for this sample."""
        ...


class AttributePower:
    """A power attribute read directly, in a unit `scale` converts to watts (hwmon µW, iio mW)."""

    def __init__(
        self, name: str, source: str, attr: Attribute, scale: float, role: PowerRole
    ) -> None:
        self.name = name
        self.source = source
        self.attr = attr
        self.attributes = (attr,)
        self.scale = scale
        self.role = role

    def __repr__(self) -> str:
        return f"AttributePower({self.name!r}, {self.source!r}, role={self.role!r})"

    def read(self, now: float) -> float | None:
        raw = self.attr.read_int(0, round(POWER_MAX_W / self.scale))
        return None if raw is None else raw * self.scale
