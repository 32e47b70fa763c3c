"""Cooling health in the daemon: the parts put together, with the log, the events and the state
folder at the edges (README, "Cooling health"; docs/cooling-health.md).

The control loop hands every governing reading to `collector` (mcpd.governor.cooling_windows) and
says which board they are of (`begin`); nothing else happens on its thread. The status path
(`refresh`, on the threads that build the status document, at least once a second in the daemon)
fits each completed window (mcpd.governor.cooling_fit: tens of milliseconds of arithmetic, every
half hour), steps the health (mcpd.governor.cooling_health), says what changed (a log line and a
`cooling` event: the baseline learned, the cooling degraded, back to normal) and keeps the health
in the state folder (mcpd.governor.cooling_store).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from mcpd.config import CoolingSection
from mcpd.events import Event, EventBus
from mcpd.governor import cooling_fit, cooling_health, cooling_store
from mcpd.governor.board import Board
from mcpd.governor.cooling_health import Change, Estimate, Health
from mcpd.governor.cooling_store import CoolingStore
from mcpd.governor.cooling_windows import Window, WindowCollector
from mcpd.snapshot import CoolingStatus
from sensors import SensorSet
from sensors.discovery import PowerOptions

log = logging.getLogger("mcpd.governor.cooling")


def fingerprint(board: Board, sensors: SensorSet, power: PowerOptions) -> dict[str, Any]:
    """What a baseline depends on: the board, the sensors that govern, and where the power comes
    from (an estimate's scale follows its coefficients)."""
    plan = sensors.power_plan
    coefficients = power.coefficients if plan.source == "estimate" else {}
    return {
        "platform": board.platform,
        "model": board.model,
        "temperatures": sorted(sensors.governing_names),
        "power": plan.source,
        "meters": sorted(plan.names),
        "coefficients": dict(sorted(coefficients.items())),
    }


_SAID = {"baseline": logging.INFO, "degraded": logging.WARNING, "recovered": logging.INFO}


class CoolingWatch:
    def __init__(
        self,
        events: EventBus,
        store: CoolingStore | None,
        settings: CoolingSection,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self.events = events
        self.store = store
        self.settings = settings
        self.clock = clock
        self.wall = wall
        self.collector = WindowCollector()
        self.health = Health()
        """Of the board the readings are of now."""
        self.windows = 0
        self.rejected = 0
        self._board = ""
        self._others: dict[str, Health] = {}
        """The health of every other fingerprint known (from the file, or met before in this
        run), the most recent last."""
        self._loaded = False
        self._unsaved = False

    # -- the control loop's thread ---------------------------------------------------------------

    def begin(self, board: Board, sensors: SensorSet, power: PowerOptions) -> None:
        """The governing readings are of this board and sensors from now on; the same again (a
        re-discovery that found them as they were) changes nothing."""
        board_key = cooling_store.key(fingerprint(board, sensors, power))
        if board_key != self.collector.board:
            self.collector.begin(board_key)

    def add_temperature(self, t: float, celsius: float) -> None:
        if self.settings.enabled:
            self.collector.add_temperature(t, celsius)

    def add_power(self, t: float, watts: float) -> None:
        if self.settings.enabled:
            self.collector.add_power(t, watts)

    # -- the status path -------------------------------------------------------------------------

    def refresh(self, now: float) -> None:
        """Take the completed windows into the health, and keep it (at most once a minute)."""
        board = self.collector.board
        if board and board != self._board:
            self._switch(board)
        for window in self.collector.take():
            if window.board == self._board:
                self._take(window)
        if self._unsaved and self.store is not None:
            offset = self.wall() - self.clock()
            kept = [(self._board, self.health), *reversed(self._others.items())]
            self._unsaved = not self.store.keep(kept, offset, now)

    def reload(self, settings: CoolingSection) -> None:
        self.settings = settings

    def status(self) -> CoolingStatus:
        if not self.settings.enabled:
            return CoolingStatus()
        health = self.health
        figures = cooling_health.figures(health, self.settings)
        now, base = figures.now, health.baseline
        offset = self.wall() - self.clock()
        return CoolingStatus(
            state=health.state,
            r_c_per_w=None if now is None else now.r_c_per_w,
            tau_s=None if now is None else now.tau_s,
            intercept_c=None if now is None else now.intercept_c,
            confidence=figures.confidence,
            baseline_c_per_w=None if base is None else base.r_c_per_w,
            drift_ratio=figures.drift_ratio,
            since=None if figures.since is None else figures.since + offset,
            updated=None if now is None else now.end + offset,
            windows=self.windows,
            rejected=self.rejected,
        )

    def _switch(self, board: str) -> None:
        """The readings are of `board` now (at start, or sensors found again differently): its
        health as last known, from this run or the state folder."""
        if self._board:
            self._others[self._board] = self.health
        if not self._loaded and self.store is not None:
            self._loaded = True
            kept = self.store.load(self.wall() - self.clock())
            known = kept.get(board)
            if known is not None and known.baseline is not None:
                log.info(
                    "cooling: baseline %.2f °C/W from %s",
                    known.baseline.r_c_per_w,
                    self.store.path,
                )
            elif kept and known is None:
                log.warning(
                    "cooling %s: learned on another board, governing sensor or power source; "
                    "learning this one's baseline",
                    self.store.path,
                )
            # The file has the most recent first; these are kept the most recent last.
            self._others = {**dict(reversed(kept.items())), **self._others}
        self._board = board
        self.health = self._others.pop(board, Health())

    def _take(self, window: Window) -> None:
        fitted = cooling_fit.fit(window.temps, window.powers)
        why = cooling_fit.assess(window.powers, fitted)
        if why is not None or fitted is None:
            self.rejected += 1
            log.debug("cooling: window not used: %s", why)
            return
        self.windows += 1
        estimate = Estimate(
            window.start, window.end, fitted.r_c_per_w, fitted.tau_s, fitted.intercept_c
        )
        self.health, change = cooling_health.step(self.health, estimate, self.settings)
        self._unsaved = True
        if change is not None:
            self._say(change)

    def _say(self, change: Change) -> None:
        status = self.status()
        r, base = status.r_c_per_w, status.baseline_c_per_w
        assert r is not None and base is not None
        if change == "baseline":
            message = (
                f"cooling baseline learned: {base:.2f} °C/W, time constant {status.tau_s:.0f} s"
            )
        elif change == "degraded":
            hours = self.settings.sustained_s / 3600
            message = (
                f"cooling degraded: thermal resistance {r:.2f} °C/W, {status.drift_ratio:.2f} x "
                f"its baseline {base:.2f} °C/W for {hours:g} h or more (dust, a fan, the paste?)"
            )
        else:
            message = f"cooling back to normal: {r:.2f} °C/W against its baseline {base:.2f} °C/W"
        log.log(_SAID[change], message)
        data = {
            "change": change,
            "state": status.state,
            "thermal_resistance_c_per_w": round(r, 3),
            "baseline_c_per_w": round(base, 3),
            "drift_ratio": None if status.drift_ratio is None else round(status.drift_ratio, 3),
            "time_constant_s": None if status.tau_s is None else round(status.tau_s, 1),
            "since": None if status.since is None else round(status.since, 3),
        }
        self.events.publish(Event("cooling", message, data))
