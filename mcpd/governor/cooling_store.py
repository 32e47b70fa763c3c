"""The cooling's baseline and recent windows, kept across restarts in the state folder.

A board's baseline is learned once, over its first hours of work (mcpd.governor.cooling_health),
and wear shows only against it: a restart (an upgrade, a reboot) must not learn it again from a
board that has meanwhile lost its fan. So the health (the baseline, the last windows, the run in
progress and since when it is degraded) is kept in the state folder
(/var/lib/mcpd/cooling.json), with every time as Unix time, and given back at start.

As mcpd.governor.power_map does for learned power, each health says which board, governing
sensors and power source it was learned on (its fingerprint): another board, another sensor
governing, a meter where an estimate was, other Energy Model coefficients each move the resistance
the fit finds, so a health of anything else is not used (mcpd.governor.cooling names a file that
holds none for the board it runs on). Unlike learned power, the file keeps the health of the last
`BOARDS` fingerprints, the one in use first: a governing sensor that vanishes for a while (a
driver unbound, a zone power-gated) changes the fingerprint until it is back, and the baseline of
the board as it was must outlive that. It is read and written through safefs (never through a
planted link), bounded in size, checked entry by entry, replaced atomically, at most once a minute
and only when it changed (a window every half hour at most: a handful of writes a day). A disk
that cannot be written costs the next restart the baseline, never the governing. Delete the file
after servicing the cooling (a new fan, fresh paste): the daemon learns the serviced board.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mcpd.governor.cooling_health import BASELINE_WINDOWS, RECENT, Estimate, Health, Run
from mcpd.governor.state_file import StateFile

log = logging.getLogger("mcpd.governor.cooling")

FILENAME = "cooling.json"
_FORMAT = 1
_LIMIT = 2**18
BOARDS = 4
_RANGES = {
    "r_c_per_w": (0.0, 1000.0),
    "tau_s": (0.0, 1e6),
    "intercept_c": (-200.0, 300.0),
}
"""Open intervals each saved figure must lie in."""


class CoolingStore:
    """The health in one folder. Never raises: problems are logged and cost only the baseline."""

    def __init__(self, folder: str | Path) -> None:
        self.file = StateFile(folder, FILENAME, _LIMIT, "cooling baseline", log)
        self._saved: bytes | None = None

    @property
    def path(self) -> Path:
        return self.file.path

    def load(self, offset: float) -> dict[str, Health]:
        """Every health the file keeps, by fingerprint (as `key` writes it), its times moved to
        the loop's clock (Unix time less `offset`); none when there is no file or it is not
        usable (named in the log)."""
        try:
            document = self.file.read()
            return {} if document is None else parse(document, offset)
        except (OSError, ValueError) as exc:  # safefs.CorruptFileError is a ValueError
            log.warning("cooling %s: %s; learning the baseline again", self.path, exc)
            return {}

    def due(self, now: float) -> bool:
        return self.file.due(now)

    def keep(self, healths: Sequence[tuple[str, Health]], offset: float, now: float) -> bool:
        """Save the healths (by fingerprint, the one in use first; the first `BOARDS`) when the
        last save is a minute old; True once they are saved (or already were), False when it is
        to be tried again."""
        data = render(healths, offset)
        if data == self._saved:
            return True
        if not self.due(now):
            return False
        if not self.file.write(data, now):
            return False
        self._saved = data
        return True


def _estimate(e: Estimate, offset: float) -> dict[str, float]:
    return {
        "start": round(e.start + offset, 3),
        "end": round(e.end + offset, 3),
        "r_c_per_w": round(e.r_c_per_w, 4),
        "tau_s": round(e.tau_s, 2),
        "intercept_c": round(e.intercept_c, 3),
    }


def key(board: Mapping[str, Any]) -> str:
    """A fingerprint as one string: equal boards, equal keys."""
    return json.dumps(board, sort_keys=True)


def render(healths: Sequence[tuple[str, Health]], offset: float) -> bytes:
    boards = []
    for board, health in healths[:BOARDS]:
        run, since = health.run, health.degraded_since
        boards.append(
            {
                "fingerprint": json.loads(board),
                "baseline": None if health.baseline is None else _estimate(health.baseline, offset),
                "learning": [_estimate(e, offset) for e in health.learning],
                "recent": [_estimate(e, offset) for e in health.recent],
                "run": None
                if run is None
                else {
                    "above": run.above,
                    "start": round(run.start + offset, 3),
                    "windows": run.windows,
                },
                "degraded_since": None if since is None else round(since + offset, 3),
            }
        )
    return json.dumps({"format": _FORMAT, "boards": boards}, indent=1).encode()


def parse(document: object, offset: float) -> dict[str, Health]:
    """The healths in a document read by safefs.read_json, by fingerprint. Raises ValueError
    naming what is wrong."""
    if not isinstance(document, dict) or document.get("format") != _FORMAT:
        raise ValueError(f"not a format-{_FORMAT} cooling file")
    boards = document.get("boards")
    if not isinstance(boards, list) or len(boards) > BOARDS:
        raise ValueError(f'"boards" is not a list of at most {BOARDS}')
    healths = {}
    for number, entry in enumerate(boards):
        if not isinstance(entry, dict) or not isinstance(entry.get("fingerprint"), dict):
            raise ValueError(f"boards[{number}] has no fingerprint")
        healths[key(entry["fingerprint"])] = _health(f"boards[{number}]", entry, offset)
    return healths


def _health(where: str, entry: dict[str, Any], offset: float) -> Health:
    baseline = entry.get("baseline")
    run = entry.get("run")
    if run is not None and not isinstance(run, dict):
        raise ValueError(f"{where}.run is not an object")
    return Health(
        baseline=None
        if baseline is None
        else _parse_estimate(f"{where}.baseline", baseline, offset),
        learning=_estimates(entry, where, "learning", BASELINE_WINDOWS - 1, offset),
        recent=_estimates(entry, where, "recent", RECENT, offset),
        run=None if run is None else _parse_run(f"{where}.run", run, offset),
        degraded_since=_time(entry, "degraded_since", offset, where, optional=True),
    )


def _estimates(
    entry: dict[str, Any], where: str, name: str, most: int, offset: float
) -> tuple[Estimate, ...]:
    entries = entry.get(name)
    if not isinstance(entries, list) or len(entries) > most:
        raise ValueError(f"{where}.{name} is not a list of at most {most}")
    return tuple(_parse_estimate(f"{where}.{name}[{i}]", e, offset) for i, e in enumerate(entries))


def _parse_estimate(where: str, entry: object, offset: float) -> Estimate:
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not an object")
    figures = []
    for name, (low, high) in _RANGES.items():
        value = _number(entry, name, where)
        if not low < value < high:
            raise ValueError(f"{where}.{name} {value!r} is not in ({low:g}, {high:g})")
        figures.append(value)
    start, end = _time(entry, "start", offset, where), _time(entry, "end", offset, where)
    assert start is not None and end is not None
    return Estimate(start, end, *figures)


def _parse_run(where: str, run: dict[str, Any], offset: float) -> Run:
    above, windows = run.get("above"), run.get("windows")
    if not isinstance(above, bool):
        raise ValueError(f"{where}.above is not true or false")
    if isinstance(windows, bool) or not isinstance(windows, int) or windows < 1:
        raise ValueError(f"{where}.windows {windows!r} is not a count")
    start = _time(run, "start", offset, where)
    assert start is not None
    return Run(above, start, windows)


def _number(entry: Mapping[str, Any], name: str, where: str) -> float:
    value = entry.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}.{name} {value!r} is not a number")
    return float(value)


def _time(
    entry: Mapping[str, Any], name: str, offset: float, where: str, *, optional: bool = False
) -> float | None:
    if optional and entry.get(name) is None:
        return None
    return _number(entry, name, where) - offset
