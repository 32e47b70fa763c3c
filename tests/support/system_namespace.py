"""A real systemd, booted as PID 1 of a private PID and mount namespace (see the project's
systemd-sandbox.md), for the system tests.

The namespace shares the host's file systems, so it gets its own tmpfs on /tmp, /var/tmp and /run
(systemd-tmpfiles would otherwise empty the host's /tmp), and `container=` in PID 1's environment:
systemd then behaves as in a container and leaves the host's kernel, devices and disks alone. It
boots sysinit.target only, with the units that act on the host (udev, sysctl, binfmt, module
loading, clock, tmpfiles cleanup, the persistent journal) masked inside the namespace, so nothing
enabled on the host (a broker, a database, timers) starts twice.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

MASKED = (
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service",
    "systemd-udev-settle.service",
    "systemd-sysctl.service",
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    "systemd-modules-load.service",
    "kmod-static-nodes.service",
    "systemd-tmpfiles-setup.service",
    "systemd-tmpfiles-setup-dev.service",
    "systemd-tmpfiles-clean.timer",
    "systemd-sysusers.service",
    "systemd-journal-flush.service",
    "systemd-random-seed.service",
    "systemd-timesyncd.service",
    "systemd-update-utmp.service",
    "systemd-pstore.service",
    "systemd-repart.service",
    "systemd-firstboot.service",
    "systemd-machine-id-commit.service",
)

_UNSHARE = ("unshare", "--fork", "--pid", "--mount", "--mount-proc", "--propagation", "private")
# Masks go to /run/systemd/system.control, which outranks /etc/systemd/system: they hold inside
# the namespace whatever the host has enabled, and vanish with its /run.
_BOOT = r"""
set -e
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /var/tmp
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/lock /run/systemd/system.control
# Build images forbid service actions in maintainer scripts (policy-rc.d exits 101); a board
# does not. Hidden inside the namespace only.
if [ -e /usr/sbin/policy-rc.d ]; then mount --bind /dev/null /usr/sbin/policy-rc.d; fi
for unit in "$@"; do ln -s /dev/null "/run/systemd/system.control/$unit"; done
exec env container=mcpd-system-test /lib/systemd/systemd --system --unit=sysinit.target
"""


def can_boot() -> str | None:
    """Why a systemd cannot be booted here, or None if it can."""
    if os.geteuid() != 0:
        return "the system tests boot systemd in a namespace, which needs root"
    for tool in ("unshare", "nsenter", "systemctl", "dpkg"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/lib/systemd/systemd").exists():
        return "systemd is not installed (apt-get install systemd)"
    probe = subprocess.run(
        ["unshare", "--fork", "--pid", "--mount", "--mount-proc", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot create PID and mount namespaces: {probe.stderr.strip()}"
    return None


class Namespace:
    """One booted systemd. Every command goes through nsenter into its PID and mount namespace."""

    def __init__(self, log: Path) -> None:
        self.log = log
        with open(log, "wb") as output:
            self._unshare = subprocess.Popen(
                [*_UNSHARE, "sh", "-c", _BOOT, "sh", *MASKED],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self._find_systemd()

    def _find_systemd(self, timeout: float = 30.0) -> int:
        """systemd is the child of the unshare process we started (never a search by name)."""
        children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/children")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._unshare.poll() is not None:
                raise RuntimeError(f"the namespace ended at boot:\n{self.log.read_text()}")
            for pid in children.read_text().split():
                if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                    return int(pid)
            time.sleep(0.05)
        raise RuntimeError(f"systemd did not start:\n{self.log.read_text()}")

    def run(
        self, *command: str, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["nsenter", "-t", str(self.pid), "-p", "-m", *command],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
            )
        return result

    def systemctl(self, *args: str, check: bool = True) -> str:
        return self.run("systemctl", *args, check=check).stdout

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        text = self.systemctl("show", unit, "-p", ",".join(properties))
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def journal(self, unit: str, since_cursor: str | None = None) -> str:
        args = ["journalctl", "-u", unit, "--no-pager", "-o", "cat"]
        if since_cursor:
            args += ["--after-cursor", since_cursor]
        return self.run(*args).stdout

    def cursor(self) -> str:
        """The journal's current position, to read only what comes after it."""
        text = self.run("journalctl", "-n", "0", "--show-cursor", "--no-pager").stdout
        return text.rsplit("-- cursor: ", 1)[1].strip()

    def path(self, inside: str) -> Path:
        """A path as the namespace sees it (its own /run, /tmp), reachable from the host."""
        return Path(f"/proc/{self.pid}/root") / inside.lstrip("/")

    def wait_booted(self, timeout: float = 90.0) -> str:
        """ "running" or "degraded" once the boot transaction is done."""
        deadline = time.monotonic() + timeout
        while not self.path("/run/systemd/private").exists():
            if time.monotonic() > deadline or self._unshare.poll() is not None:
                raise RuntimeError(f"systemd did not come up:\n{self.log.read_text()}")
            time.sleep(0.05)
        state = self.run("systemctl", "is-system-running", "--wait", check=False, timeout=timeout)
        return state.stdout.strip()

    def poweroff(self, timeout: float = 90.0) -> None:
        """A clean power-off stops every unit (ExecStopPost= included) and ends the namespace;
        if it lingers, only the systemd we started is killed, which ends the namespace too."""
        if self._unshare.poll() is None:
            self.run("systemctl", "poweroff", check=False, timeout=30)
        try:
            self._unshare.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Still our systemd (the child of our unshare), never a reused process id.
            try:
                parent = Path(f"/proc/{self.pid}/stat").read_text().split()[3]
            except FileNotFoundError:
                parent = ""
            if parent == str(self._unshare.pid):
                os.kill(self.pid, signal.SIGKILL)
            self._unshare.wait(timeout=30)
