"""A simulated board for the system tests, and a way to wedge one of its sensors.

The board's tree must be visible to the service inside the namespace, so it lives under /var/lib
(never /tmp or /run, which the namespace replaces). A wedged sensor is a FUSE folder whose
temperature file hangs in read(2), as one from a hung driver does (tests/support/fusewedge.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import PROJECT

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
    """SENSOR's folder mounted over by tests/support/fusewedge.py: a read of SENSOR hangs in the kernel, as
    one from a hung driver does (a FIFO would not: mcpd opens sensors with O_NONBLOCK and reads
    regular files only), so the control loop hangs in the read while the rest of the daemon runs on.
    The simulator keeps writing the folder underneath.

    `mount_namespace` is where the wedge is mounted: the test's systemd's (/proc/PID/ns/mnt), for a
    service started afterwards, or a running service's own (it has a private one: mounts made
    outside after it started do not reach it)."""

    def __init__(self, board: SimulatedBoard, mount_namespace: Path, log: Path) -> None:
        self.folder = (board.root / SENSOR).parent
        # Beside the board: the test (outside) and the FUSE process (inside) both see it.
        self.control = Path(tempfile.mkdtemp(prefix="wedge-", dir=board.root.parent))
        command = [
            sys.executable,
            "-m",
            "tests.support.fusewedge",
            str(mount_namespace),
            str(self.folder),
            Path(SENSOR).name,
            str(self.control),
        ]
        with open(log, "ab") as output:
            self._process = subprocess.Popen(command, cwd=PROJECT, stderr=output)
        inside = Path(f"/proc/{self._process.pid}/root") / str(self.folder).lstrip("/")
        deadline = time.monotonic() + 30
        while not os.path.ismount(inside):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the wedge did not mount:\n{log.read_text()}")
            time.sleep(0.05)
        # A reader that keeps the file open (mcpd does) reopens it by name once it is replaced, as
        # the simulator replaces values; a board held at its floor may not change it for a while.
        real = self.folder / Path(SENSOR).name
        fd, temporary = tempfile.mkstemp(dir=self.folder)
        with os.fdopen(fd, "wb") as file:
            file.write(real.read_bytes())
        os.chmod(temporary, 0o644)
        os.replace(temporary, real)

    def blocked(self) -> bool:
        """Whether a reader is hung in the sensor's read now (or was)."""
        return (self.control / "blocked").exists()

    def release(self) -> None:
        """Every hung read answered, and the folder a plain one again."""
        (self.control / "release").touch()
        time.sleep(0.2)  # hung reads see it within 10 ms
        # libfuse leaves its loop on SIGTERM and unmounts, in the namespace it mounted in.
        self._process.terminate()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        shutil.rmtree(self.control, ignore_errors=True)
