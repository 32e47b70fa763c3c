"""The cooling's baseline and recent windows, kept across restarts in the state folder.

A board's baseline is learned once, over its first hours of work (mcpd.governor.cooling_health),
and wear shows only against it: a restart (an upgrade, a reboot) must not learn it again from a
board that has meanwhile lost its fan. So the health (the baseline, the last windows, the run in
progress and since when it is degraded) is kept in the state folder
(/var/lib/mcpd/cooling.json), with every time as Unix time, and given back at start.

As mcpd.governor.power_map does for learned power: the file says which board, governing sensors
and power source it was learned on, and a file of anything else (another board, another sensor
governing, a meter where an estimate was, other Energy Model coefficients: each moves the
resistance the fit finds) is named in the log and not used. It is read and written through
mcpd.safefs (never through a planted link), bounded in size, checked entry by entry, replaced
atomically, at most once a minute and only when the health changed (a window every half hour at
most: a handful of writes a day). A disk that cannot be written costs the next restart the
baseline, never the governing. Delete the file after servicing the cooling (a new fan, fresh
paste): the daemon learns the serviced board's baseline.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mcpd import safefs
from mcpd.governor.cooling_health import BASELINE_WINDOWS, RECENT, Estimate, Health, Run
from sensors.episodes import Episodes

log = logging.getLogger("mcpd.governor.cooling")

FILENAME = "cooling.json"
_FORMAT = 1
_LIMIT = 2**16
SAVE_INTERVAL_S = 60.0
_RANGES = {
    "r_c_per_w": (0.0, 1000.0),
    "tau_s": (0.0, 1e6),
    "intercept_c": (-200.0, 300.0),
}
"""Open intervals each saved figure must lie in."""


class CoolingStore:
    """The health in one folder. Never raises: problems are logged and cost only the baseline."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._saved: bytes | None = None
        self._saved_at = float("-inf")
        self._failing: Episodes[Path] = Episodes(say_changes=True)

    @property
    def path(self) -> Path:
        return self.folder / FILENAME

    def load(self, board: Mapping[str, Any], offset: float) -> Health:
        """The health kept for `board`, its times moved to the loop's clock (Unix time less
        `offset`); an empty one when there is none or it is not usable."""
        try:
            folder = safefs.open_folder(self.folder)
        except FileNotFoundError:
            return Health()
        except OSError as exc:
            log.warning("cooling: folder %s: %s; learning the baseline again", self.folder, exc)
            return Health()
        try:
            document = safefs.read_json(folder, FILENAME, _LIMIT)
            if document is None:
                return Health()
            health = parse(document, board, offset)
        except (OSError, ValueError) as exc:  # safefs.CorruptFileError is a ValueError
            log.warning("cooling %s: %s; learning the baseline again", self.path, exc)
            return Health()
        finally:
            os.close(folder)
        log.info("cooling: %s from %s", "baseline" if health.baseline else "learning", self.path)
        return health

    def due(self, now: float) -> bool:
        return now - self._saved_at >= SAVE_INTERVAL_S

    def keep(self, board: Mapping[str, Any], health: Health, offset: float, now: float) -> bool:
        """Save `health` when the last save is a minute old; True once it is saved (or already
        was), False when it is to be tried again."""
        data = render(board, health, offset)
        if data == self._saved:
            return True
        if not self.due(now):
            return False
        self._saved_at = now
        try:
            folder = safefs.open_folder(self.folder, create=True)
            try:
                safefs.write_file(folder, FILENAME, data)
            finally:
                os.close(folder)
        except OSError as exc:
            problem = f"{self.path}: {exc.strerror or exc}"
            if self._failing.fail(self.path, problem):
                log.warning("cooling baseline not saved (%s); retried in a minute", problem)
            return False
        if self._failing.succeed(self.path):
            log.info("cooling baseline saved again to %s", self.path)
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


def render(board: Mapping[str, Any], health: Health, offset: float) -> bytes:
    run = health.run
    since = health.degraded_since
    document = {
        "format": _FORMAT,
        "fingerprint": board,
        "baseline": None if health.baseline is None else _estimate(health.baseline, offset),
        "learning": [_estimate(e, offset) for e in health.learning],
        "recent": [_estimate(e, offset) for e in health.recent],
        "run": None
        if run is None
        else {"above": run.above, "start": round(run.start + offset, 3), "windows": run.windows},
        "degraded_since": None if since is None else round(since + offset, 3),
    }
    return json.dumps(document, indent=1).encode()


def parse(document: object, board: Mapping[str, Any], offset: float) -> Health:
    """The health in a document read by safefs.read_json. Raises ValueError naming what is wrong
    (or that it was learned on something else)."""
    if not isinstance(document, dict) or document.get("format") != _FORMAT:
        raise ValueError(f"not a format-{_FORMAT} cooling file")
    if document.get("fingerprint") != json.loads(json.dumps(board)):
        raise ValueError("learned on another board, governing sensor or power source")
    baseline = document.get("baseline")
    run = document.get("run")
    if run is not None and not isinstance(run, dict):
        raise ValueError('"run" is not an object')
    return Health(
        baseline=None if baseline is None else _parse_estimate("baseline", baseline, offset),
        learning=_estimates(document, "learning", BASELINE_WINDOWS - 1, offset),
        recent=_estimates(document, "recent", RECENT, offset),
        run=None if run is None else _parse_run(run, offset),
        degraded_since=_time(document, "degraded_since", offset, optional=True),
    )


def _estimates(
    document: dict[str, Any], key: str, most: int, offset: float
) -> tuple[Estimate, ...]:
    entries = document.get(key)
    if not isinstance(entries, list) or len(entries) > most:
        raise ValueError(f'"{key}" is not a list of at most {most}')
    return tuple(_parse_estimate(f"{key}[{i}]", e, offset) for i, e in enumerate(entries))


def _parse_estimate(where: str, entry: object, offset: float) -> Estimate:
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not an object")
    figures = []
    for key, (low, high) in _RANGES.items():
        value = _number(entry, key, where)
        if not low < value < high:
            raise ValueError(f"{where}.{key} {value!r} is not in ({low:g}, {high:g})")
        figures.append(value)
    start, end = _time(entry, "start", offset, where), _time(entry, "end", offset, where)
    assert start is not None and end is not None
    return Estimate(start, end, *figures)


def _parse_run(run: dict[str, Any], offset: float) -> Run:
    above, windows = run.get("above"), run.get("windows")
    if not isinstance(above, bool):
        raise ValueError("run.above is not true or false")
    if isinstance(windows, bool) or not isinstance(windows, int) or windows < 1:
        raise ValueError(f"run.windows {windows!r} is not a count")
    start = _time(run, "start", offset, "run")
    assert start is not None
    return Run(above, start, windows)


def _number(entry: Mapping[str, Any], key: str, where: str) -> float:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}.{key} {value!r} is not a number")
    return float(value)


def _time(
    entry: Mapping[str, Any], key: str, offset: float, where: str = "", *, optional: bool = False
) -> float | None:
    if optional and entry.get(key) is None:
        return None
    return _number(entry, key, where or "cooling") - offset
