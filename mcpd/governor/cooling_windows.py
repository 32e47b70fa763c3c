"""Windows of the governing readings for the cooling fit, gathered on the control loop's thread.

The loop hands over each governing temperature and power reading as it takes them (an addition
and a count: nothing here costs the loop a measurable time). They are averaged over `STEP_S` steps
on a fixed grid of the loop's clock; `WINDOW_S` of unbroken steps, each with at least one reading
of both, make a window, handed to the status path (`take`, from another thread) for the fit. A
step without a reading of either (a sensor out, a silent meter, a loop that did not run) breaks
the window: the next one starts after it, since the fit needs every step of its window. Windows do
not overlap: each fit is its own evidence.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

from mcpd.governor.cooling_fit import STEP_S

WINDOW_S = 1800.0
"""A window: several times the time constants the fit can tell (mcpd.governor.cooling_fit)."""
WINDOW_STEPS = round(WINDOW_S / STEP_S)
WAITING = 8
"""Windows kept for the status path at most (four hours of them, should nobody ask)."""


@dataclass(frozen=True)
class Window:
    board: str
    """What the readings were taken on (mcpd.governor.cooling_store's fingerprint, as JSON)."""
    start: float
    end: float
    """Of the loop's clock (monotonic seconds)."""
    temps: tuple[float, ...]
    powers: tuple[float, ...]
    """Step means, oldest first."""


class WindowCollector:
    def __init__(self) -> None:
        self.board = ""
        self._ready: collections.deque[Window] = collections.deque(maxlen=WAITING)
        self._step = -1
        self._sums = [0.0, 0.0]
        self._counts = [0, 0]
        self._temps: list[float] = []
        self._powers: list[float] = []
        self._start = 0.0

    def begin(self, board: str) -> None:
        """Readings from now on are of `board` (a new one, or sensors found again differently):
        what was gathered before is dropped."""
        self.board = board
        self._temps, self._powers = [], []
        self._step = -1
        self._sums, self._counts = [0.0, 0.0], [0, 0]

    def add_temperature(self, t: float, celsius: float) -> None:
        self._add(t, 0, celsius)

    def add_power(self, t: float, watts: float) -> None:
        self._add(t, 1, watts)

    def take(self) -> list[Window]:
        """The windows completed since the last call, oldest first (any thread)."""
        taken = []
        while self._ready:
            taken.append(self._ready.popleft())
        return taken

    def _add(self, t: float, which: int, value: float) -> None:
        step = math.floor(t / STEP_S)
        if step != self._step:
            self._close(step)
        self._sums[which] += value
        self._counts[which] += 1

    def _close(self, step: int) -> None:
        """The step in progress ends: its means join the window when it had both readings and
        the new step follows it, else the window starts again."""
        if self._step >= 0 and all(self._counts) and step == self._step + 1:
            if not self._temps:
                self._start = self._step * STEP_S
            self._temps.append(self._sums[0] / self._counts[0])
            self._powers.append(self._sums[1] / self._counts[1])
            if len(self._temps) == WINDOW_STEPS:
                end = self._start + WINDOW_S
                window = Window(
                    self.board, self._start, end, tuple(self._temps), tuple(self._powers)
                )
                self._ready.append(window)
                self._temps, self._powers = [], []
        else:
            self._temps, self._powers = [], []
        self._step = step
        self._sums, self._counts = [0.0, 0.0], [0, 0]
