"""What `mcpd bench` reads and sets on the board: power and temperature during a measurement, and
frequency caps held for part of the sweep and then put back.

Power comes from the same sensor adapters as the daemon's, so a bench figure and a status figure
mean the same thing: the board's input (or the sum of its rails, or RAPL; docs/sysfs.md), sampled
every 100 ms like the governor samples it. Energy per inference is that board energy divided by
the inferences run in the window: idle draw included, which is what a battery pays for.

Caps are written with the daemon's own frequency domains (snapped to the hardware's table, through
descriptors that cannot be redirected by a link), the text the kernel showed before is written
back afterwards, whatever happened in between. A sweep that heats the board to the governor's
threshold stops and puts the caps back: the bench never holds caps on a board the governor would
throttle.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mcpd.governor import domains
from mcpd.optimize.interface import OptimizeError
from sensors import SensorSet

SAMPLE_INTERVAL_S = 0.1


@dataclass(frozen=True)
class Window:
    """Board readings over one measurement."""

    watts: float | None
    """Mean power; None where the board has no meter (or it gave no reading)."""
    estimated: bool
    peak_c: float | None


class BoardWatch:
    """Samples power and temperature on its own thread while a measurement runs."""

    def __init__(
        self,
        sensors: SensorSet,
        limit_c: float,
        interval_s: float = SAMPLE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sensors = sensors
        self.limit_c = limit_c
        self.interval_s = interval_s
        self.clock = clock
        self.too_hot = threading.Event()
        """Set when the governing temperature reached `limit_c`: the caller stops."""
        self._stop = threading.Event()
        self._watts: list[float] = []
        self._peak: float | None = None
        self._estimated = False

    def _sample(self) -> None:
        power = self.sensors.sample_powers(self.clock())
        if power.watts is not None:
            self._watts.append(power.watts)
            self._estimated = power.estimated
        celsius = self.sensors.sample_temperatures().celsius
        if celsius is not None:
            self._peak = celsius if self._peak is None else max(self._peak, celsius)
            if celsius >= self.limit_c:
                self.too_hot.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    @contextmanager
    def window(self) -> Iterator[Callable[[], Window]]:
        """Sample until the block ends; the yielded function gives the window's readings then.
        Counter-based meters (RAPL) need a first read to difference against: taken at the start."""
        self._watts, self._peak, self._stop = [], None, threading.Event()
        self.sensors.sample_powers(self.clock())
        thread = threading.Thread(target=self._run, name="bench-meter", daemon=True)
        thread.start()
        try:
            yield lambda: Window(
                statistics.fmean(self._watts) if self._watts else None,
                self._estimated,
                self._peak,
            )
        finally:
            self._stop.set()
            thread.join()
            self._sample()


def domains_to_cap(root: Path) -> list[domains.FrequencyDomain]:
    found = domains.discover(root)
    if not found:
        raise OptimizeError(f"--caps: no frequency domain found under {root}")
    return found


@contextmanager
def caps_held(found: list[domains.FrequencyDomain], fraction: float) -> Iterator[dict[str, float]]:
    """Every domain capped at `fraction` of its maximum (snapped); the caps the kernel showed
    before are written back when the block ends. Yields the caps in force, in MHz."""
    before = {d.name: d.read_cap_text() for d in found}
    unreadable = [name for name, text in before.items() if text is None]
    if unreadable:
        raise OptimizeError(f"--caps: cannot read the cap of {', '.join(unreadable)}")
    try:
        held = {}
        for domain in found:
            try:
                _, held[domain.name] = domain.change_cap(fraction * domain.max_mhz)
            except domains.DomainWriteError as exc:
                raise OptimizeError(f"--caps: {exc} (writing caps needs root)") from None
        yield held
    finally:
        failed = []
        for domain in found:
            try:
                domain.write_raw(before[domain.name] or "")
            except domains.DomainWriteError as exc:
                failed.append(str(exc))
        if failed:
            raise OptimizeError("could not put caps back: " + "; ".join(failed))
