"""The governor's parameters: the one place they and their defaults are defined.

Every policy reads its thresholds, step factors and frequency clamp from one `GovernorParams`; the
config's [governor] keys (and each profile's overrides) are these, with these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class GovernorParams:
    temp_high_c: float = 85.0
    """At or above: lower."""
    temp_low_c: float = 75.0
    """At or below (and power at or below power_low_w): raise."""
    power_high_w: float = 12.0
    power_low_w: float = 9.0
    down_factor: float = 0.7
    """Each lowering step multiplies caps and batch sizes by this."""
    up_factor: float = 1.15
    min_mhz: float = 800.0
    """The clamp every domain's cap stays inside (intersected with the hardware's range)."""
    max_mhz: float = 3200.0

    def __post_init__(self) -> None:
        """Raises ValueError naming the first problem."""
        if not self.temp_low_c < self.temp_high_c:
            raise ValueError("temp_low_c must be below temp_high_c")
        if not self.power_low_w < self.power_high_w:
            raise ValueError("power_low_w must be below power_high_w")
        if not 0 < self.down_factor < 1 < self.up_factor:
            raise ValueError("need 0 < down_factor < 1 < up_factor")
        if not self.min_mhz > 0:
            raise ValueError("min_mhz must be above 0")
        if not self.min_mhz < self.max_mhz:
            raise ValueError("min_mhz must be below max_mhz")


PARAMETER_NAMES = tuple(f.name for f in fields(GovernorParams))
