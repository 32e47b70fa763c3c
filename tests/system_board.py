"""A simulated board for the system tests, and a way to wedge one of its sensors.

The board's tree must be visible to the service inside the namespace, so it lives under /var/lib
(never /tmp or /run, which the namespace replaces). A wedged sensor is a FIFO in place of a
temperature file: opening it blocks, as a read from a hung driver does, so the control loop
hangs in the read while the rest of the daemon runs on.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROFILE = "rk3588"
KNOBS = (
    "sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq",
    "sys/devices/system/cpu/cpufreq/policy4/scaling_max_freq",
    "sys/devices/system/cpu/cpufreq/policy6/scaling_max_freq",
    "sys/class/devfreq/fb000000.gpu/max_freq",
    "sys/class/devfreq/fdab0000.npu/max_freq",
)
"""The caps mcpd governs on the rk3588 profile."""
SENSOR = "sys/devices/virtual/thermal/thermal_zone0/temp"


class SimulatedBoard:
    def __init__(self, root: Path, log: Path) -> None:
        self.root = root
        with open(log, "wb") as output:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "mcpd", "sim", "--profile", PROFILE, "--root", str(root)],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while not all((root / knob).exists() for knob in (*KNOBS, SENSOR)):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the simulator did not build its tree:\n{log.read_text()}")
            time.sleep(0.1)
        self.baseline = self.caps()

    def caps(self) -> dict[str, int]:
        return {knob: self._cap(self.root / knob) for knob in KNOBS}

    @staticmethod
    def _cap(path: Path) -> int:
        # A plain file, not sysfs: mcpd's write (truncate, then write) can be caught half-way.
        for _ in range(100):
            text = path.read_text().strip()
            if text:
                return int(text)
            time.sleep(0.001)
        raise AssertionError(f"{path} stays empty")

    def owners(self) -> set[int]:
        return {(self.root / knob).stat().st_uid for knob in KNOBS}

    def pause(self) -> None:
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self._process.poll() is None:
            self.resume()
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=30)


class WedgedSensor:
    """SENSOR replaced by a FIFO while the simulator is paused (it would replace it back)."""

    def __init__(self, board: SimulatedBoard) -> None:
        self.board = board
        self.path = board.root / SENSOR
        # A second name for the FIFO, to reach a reader still blocked on it after release().
        self._link = self.path.with_name(".wedged")
        board.pause()
        self.value = self.path.read_text()
        self.path.unlink()
        os.mkfifo(self.path, 0o644)
        os.link(self.path, self._link)

    def feed(self) -> bool:
        """Hand one reading to a reader blocked on the FIFO; False if none is waiting."""
        try:
            fd = os.open(self._link, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no reader has it open
                return False
            raise
        try:
            os.write(fd, self.value.encode())
        finally:
            os.close(fd)
        return True

    def release(self) -> None:
        """A regular file again (atomically, as the simulator writes), any blocked reader fed,
        and the simulator running."""
        fd, temporary = tempfile.mkstemp(dir=self.path.parent)
        with os.fdopen(fd, "w") as file:
            file.write(self.value)
        os.chmod(temporary, 0o644)
        os.replace(temporary, self.path)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            self.feed()
            time.sleep(0.05)
        self._link.unlink()
        self.board.resume()
