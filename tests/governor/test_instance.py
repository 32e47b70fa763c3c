"""One daemon per set of folders: a second `mcpd run` exits before it touches anything
(mcpd/governor/instance.py, issue 26)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpd.config import DaemonSection
from mcpd.governor import instance
from mcpd.listen import listener_at
from tests.conftest import PROJECT
from tests.support.boards import POLICY4
from tests.support.daemon import RunningDaemon


@pytest.fixture
def section(tmp_path: Path) -> DaemonSection:
    run = tmp_path / "run"
    return DaemonSection(
        runtime_dir=str(run), state_dir=str(tmp_path / "state"), socket=str(run / "mcpd.sock")
    )


def test_a_held_folder_keeps_a_second_instance_out_and_names_the_first(
    section: DaemonSection, tmp_path: Path
) -> None:
    first = instance.claim(section, socket_passed=False)
    pid_file = tmp_path / "run" / instance.PID_FILE
    assert pid_file.read_text() == f"{os.getpid()}\n"
    # flock belongs to an open file: a second open in this same process is a second instance.
    with pytest.raises(instance.AlreadyRunning) as second:
        instance.claim(section, socket_passed=False)
    assert str(second.value) == f"another mcpd (pid {os.getpid()}) holds {tmp_path / 'run'}"
    with pytest.raises(instance.AlreadyRunning, match=f"holds {tmp_path / 'state'}"):
        instance.hold([tmp_path / "nowhere", tmp_path / "state"])
    first.release(remove_pid=True)
    assert not pid_file.exists()
    instance.hold([tmp_path / "run", tmp_path / "state"]).release()


def test_a_pid_file_left_by_a_dead_daemon_holds_nothing(
    section: DaemonSection, tmp_path: Path
) -> None:
    """kill -9 leaves the file; the kernel dropped the lock with the process."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / instance.PID_FILE).write_text("4242\n")
    with instance.claim(section, socket_passed=False):
        assert (tmp_path / "run" / instance.PID_FILE).read_text() == f"{os.getpid()}\n"


def test_one_folder_under_two_names_is_locked_once(tmp_path: Path) -> None:
    both = DaemonSection(runtime_dir=str(tmp_path), state_dir=str(tmp_path / "."))
    instance.claim(both, socket_passed=False).release()


@pytest.fixture
def listening(section: DaemonSection) -> Iterator[socket.socket]:
    os.makedirs(Path(section.socket).parent, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(section.socket)
    server.listen(0)
    yield server
    server.close()


def test_a_listener_on_the_socket_is_another_instance(
    section: DaemonSection, listening: socket.socket, tmp_path: Path
) -> None:
    """Its folders may be elsewhere: the socket says so all the same, unless systemd passed it."""
    with pytest.raises(instance.AlreadyRunning) as second:
        instance.claim(section, socket_passed=False)
    assert (
        str(second.value) == f"another process (pid {os.getpid()}) is serving on {section.socket}"
    )
    assert not (tmp_path / "run" / instance.PID_FILE).exists()
    instance.hold([tmp_path / "run", tmp_path / "state"]).release()  # nothing left locked
    instance.claim(section, socket_passed=True).release()


def test_a_listener_with_a_full_backlog_is_found_without_waiting(
    section: DaemonSection, listening: socket.socket
) -> None:
    """A blocking connect would sleep until the listener had room: for ever, if it is stuck."""
    clients = []
    try:
        while True:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
            clients.append(client)
            client.connect(section.socket)
    except BlockingIOError:
        pass
    finally:
        for client in clients:
            client.close()
        clients.clear()
    occupant = listener_at(section.socket)
    assert occupant is not None and str(occupant) == "another process (its backlog full)"


def test_a_socket_left_by_a_dead_process_is_no_instance(section: DaemonSection) -> None:
    os.makedirs(Path(section.socket).parent)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(section.socket)
    server.listen(1)
    server.close()  # the file stays
    assert listener_at(section.socket) is None
    instance.claim(section, socket_passed=False).release()


def _untouched(board: Path, state: Path) -> dict[str, object]:
    """Every cap's value, and each baseline copy's and the socket's inode, time and contents."""
    caps = [*board.glob("sys/devices/system/cpu/cpufreq/policy*/scaling_max_freq")]
    caps += board.glob("sys/class/devfreq/*/max_freq")
    seen: dict[str, object] = {str(cap): cap.read_bytes() for cap in caps}
    for path in (board / "run/mcpd/baseline.json", state / "baseline.json"):
        info = path.stat()
        seen[str(path)] = (info.st_ino, info.st_mtime_ns, path.read_bytes())
    seen["socket"] = (board / "run/mcpd/mcpd.sock").lstat().st_ino
    return seen


def test_a_second_daemon_on_the_same_config_exits_and_touches_nothing(tmp_path: Path) -> None:
    """Issue 26: the second adopted the domains, failed on the socket and "restored": the first's
    caps jumped 816 -> 2 208 MHz and both baseline copies vanished for a second. The first is
    stopped (SIGSTOP) meanwhile, so whatever changes is the second's doing."""
    board, state = tmp_path / "board", tmp_path / "state"
    config = (
        f'[daemon]\nsysfs_root = "{board}"\nstate_dir = "{state}"\n'
        f'runtime_dir = "{board / "run/mcpd"}"\nsocket = "{board / "run/mcpd/mcpd.sock"}"\n'
    )
    first = RunningDaemon(tmp_path, config)  # --simulate: the board is built under `board`
    try:
        first.receive(lambda m: m.startswith("READY=1"))
        first.wait_for(lambda: first.cap(POLICY4) < 2400000)
        pid = first.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            before = _untouched(board, state)
            mcpd = [sys.executable, "-m", "mcpd"]
            second = subprocess.run(
                [*mcpd, "run", "--config", str(first.config)],
                cwd=PROJECT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            restore = subprocess.run(
                [*mcpd, "restore", "--config", str(first.config)],
                cwd=PROJECT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            after = _untouched(board, state)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert (second.returncode, second.stdout) == (1, "")
        assert second.stderr == (
            f"mcpd run: another mcpd (pid {pid}) holds {board / 'run/mcpd'}; "
            "this one exits and touches nothing\n"
        )
        assert restore.returncode == 1
        assert restore.stderr == (
            f"mcpd restore: another mcpd (pid {pid}) holds {board / 'run/mcpd'}; "
            "it restores the caps when it stops\n"
        )
        assert after == before
        first.drain()
        first.receive(lambda m: m.startswith("STATUS="), timeout=10)  # it governs on
    finally:
        first.close()
