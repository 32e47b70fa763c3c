"""The power the adaptive policy learned at each set of caps, kept across restarts.

On a metered board the policy learns what each level draws at its peak (governors/adaptive.py);
until it has, the first full load at a level it has not measured can cross the power limit for a
meter window, and after a power cut at start it climbs back a level at a time. A restart (an
upgrade, a reboot) would pay that again. So the learned peaks are kept in the state folder
(/var/lib/mcpd/learned-power.json) and given back to the policy at start.

The file says which board, meters and frequency tables it was learned on; a file for anything
else (another module in the carrier board, a different meter, a new kernel's tables) is not used.
It is read and written through safefs (never through a planted link), bounded in size, and
checked entry by entry: a file that is not what mcpd writes is reported once, by name and what is
wrong with it, and the daemon learns from scratch; it is replaced at the next save. The file holds
the peaks the policy holds: a peak it forgot (not reached for ten minutes, governors/adaptive.py)
is forgotten here too, so that a load long gone does not bar a level again at every restart.
Writes happen at most once a minute and only when something changed (a new set of caps, a peak
moved by 1 % or more, one forgotten), so a board's eMMC sees a handful a day once it has
settled. A disk that cannot be written costs the next restart its head start, never the
governing.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mcpd.governor.state_file import StateFile

log = logging.getLogger("mcpd.governor.power_map")

FILENAME = "learned-power.json"
_FORMAT = 1
_LIMIT = 2**20
CHANGE_TO_SAVE = 0.01
"""A known peak that moved by less than this fraction is not worth a write."""
MAX_WATTS = 10_000.0

Caps = tuple[tuple[str, float], ...]
"""A level's caps, (domain, MHz) sorted by domain."""


class PowerMapStore:
    """The learned peaks in one folder. Never raises: problems are logged once and cost only the
    head start."""

    def __init__(self, folder: str | Path) -> None:
        self.file = StateFile(folder, FILENAME, _LIMIT, "learned power", log)
        self.saved: dict[Caps, float] = {}
        """What the file holds (or was loaded from it)."""

    @property
    def path(self) -> Path:
        return self.file.path

    def load(self, fingerprint: Mapping[str, Any]) -> dict[Caps, float]:
        """The peaks learned on this board before; {} when there are none or they are not usable."""
        try:
            document = self.file.read()
            if document is None:
                return {}
            peaks = parse(document, fingerprint)
        except (OSError, ValueError) as exc:  # safefs.CorruptFileError is a ValueError
            log.warning("learned power %s: %s; learning from scratch", self.path, exc)
            return {}
        self.saved = peaks
        log.info("learned power: %d levels from %s", len(peaks), self.path)
        return dict(peaks)

    def due(self, now: float) -> bool:
        """Whether the last save is a minute old (the caller need not gather anything before)."""
        return self.file.due(now)

    def keep(self, fingerprint: Mapping[str, Any], peaks: Mapping[Caps, float], now: float) -> None:
        """Save `peaks` when they changed and the last save is a minute old."""
        if not self.due(now) or not _news(peaks, self.saved):
            return
        if self.file.write(render(fingerprint, peaks), now):
            self.saved = dict(peaks)


def _news(peaks: Mapping[Caps, float], saved: Mapping[Caps, float]) -> bool:
    if peaks.keys() != saved.keys():
        return True
    return any(abs(w - saved[caps]) >= saved[caps] * CHANGE_TO_SAVE for caps, w in peaks.items())


def render(fingerprint: Mapping[str, Any], peaks: Mapping[Caps, float]) -> bytes:
    document = {
        "format": _FORMAT,
        "fingerprint": fingerprint,
        "peaks": [
            {"caps_mhz": dict(caps), "watts": round(watts, 3)}
            for caps, watts in sorted(peaks.items())
        ],
    }
    return json.dumps(document, indent=1).encode()


def parse(document: object, fingerprint: Mapping[str, Any]) -> dict[Caps, float]:
    """The peaks in a document read by safefs.read_json. Raises ValueError naming what is wrong
    (or that it was learned on something else)."""
    if not isinstance(document, dict) or document.get("format") != _FORMAT:
        raise ValueError(f"not a format-{_FORMAT} learned-power file")
    if document.get("fingerprint") != json.loads(json.dumps(fingerprint)):
        raise ValueError("learned on another board, meter or set of frequency tables")
    entries = document.get("peaks")
    if not isinstance(entries, list):
        raise ValueError('"peaks" is not a list')
    peaks: dict[Caps, float] = {}
    for number, entry in enumerate(entries):
        caps = entry.get("caps_mhz") if isinstance(entry, dict) else None
        watts = entry.get("watts") if isinstance(entry, dict) else None
        if not isinstance(caps, dict) or not caps:
            raise ValueError(f"peaks[{number}]: no caps_mhz")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in caps.values()):
            raise ValueError(f"peaks[{number}]: caps_mhz must be numbers")
        if isinstance(watts, bool) or not isinstance(watts, (int, float)):
            raise ValueError(f"peaks[{number}]: watts {watts!r} is not a number")
        if not 0 < watts <= MAX_WATTS:
            raise ValueError(f"peaks[{number}]: watts {watts!r} is not in (0, {MAX_WATTS:g}]")
        peaks[tuple(sorted((str(name), float(mhz)) for name, mhz in caps.items()))] = float(watts)
    return peaks
