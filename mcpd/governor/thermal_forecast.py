"""Thermal headroom for applications. Pure: a temperature and the threshold in, a number out.

1.0 at the throttle threshold (`[governor] temp_high_c`), 0.0 thirty degrees below it, linear in
between and beyond it: Android's normalization of thermal headroom (docs/thermal-headroom.md), so
an application written against getThermalHeadroom reads mcpd's the same way.
"""

from __future__ import annotations

HEADROOM_WINDOW_C = 30.0


def headroom(temp_c: float | None, threshold_c: float) -> float | None:
    if temp_c is None:
        return None
    return 1.0 - (threshold_c - temp_c) / HEADROOM_WINDOW_C
