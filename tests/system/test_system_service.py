"""mcpd as an admin runs it: installed from its Debian package with apt, managed by a real systemd
(booted in a private namespace, tests/support/system_namespace.py), governing a simulated board.

The tests run in order and share one installation: install, start, status, socket, reload,
socket activation and restarts, watchdog, kill -9, stop, purge. Each test first puts the service
in the state it needs, so one failure does not hide the others.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import system_debs
from tests.support.system_board import SimulatedBoard, WedgedSensor
from tests.support.system_namespace import Namespace, can_boot
from tests.support.waiting import wait_until

pytestmark = pytest.mark.system

CONFIG = Path("/etc/mcpd/mcpd.toml")
DROP_IN = Path("/etc/systemd/system/mcpd.service.d")
SOCKET = "/run/mcpd/mcpd.sock"
# Below the simulated die's temperature: mcpd lowers every cap to its floor.
THROTTLE = (30.0, 25.0)
# Above anything the board reaches: mcpd raises the caps back to the hardware maximum.
RELEASE = (110.0, 100.0)
# Where to look for files the package or its scripts could leave behind.
SEARCHED = ("/etc", "/opt", "/var/lib", "/var/cache", "/usr/bin", "/usr/lib", "/usr/libexec")
SEARCHED_TOO = ("/usr/share/doc", "/usr/share/man", "/usr/share/lintian", "/lib/systemd")


@dataclass
class System:
    ns: Namespace
    board: SimulatedBoard
    root: Path
    deb: Path
    before: set[str]


def http_get(path: Path, target: str, timeout: float = 60.0) -> tuple[int, bytes]:
    """The status code and body of one GET over the Unix socket at `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout)
        client.connect(str(path))
        client.sendall(f"GET {target} HTTP/1.1\r\nHost: mcpd\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := client.recv(65536):
            reply += chunk
    if b"\r\n" not in reply:
        raise ConnectionError(f"closed without a response (got {reply!r})")
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def http_status(path: Path, target: str, timeout: float = 60.0) -> int:
    return http_get(path, target, timeout)[0]


def http_json(path: Path, target: str, timeout: float = 60.0) -> Any:
    return json.loads(http_get(path, target, timeout)[1])


def mcpd_files() -> set[str]:
    found = subprocess.run(
        [
            "find",
            *SEARCHED,
            *SEARCHED_TOO,
            "-name",
            "*mcpd*",
            "-not",
            "-path",
            "/var/lib/mcpd-test-*",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return set(found.stdout.split())


def installed() -> bool:
    status = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Status}", "mcpd"], capture_output=True, text=True, check=False
    )
    return "installed" in status.stdout and "not-installed" not in status.stdout


def exists(lookup: Callable[[str], object], name: str) -> bool:
    try:
        lookup(name)
    except KeyError:
        return False
    return True


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    why = can_boot()
    if why is not None:
        pytest.skip(f"cannot boot systemd on this machine: {why}")
    if installed():
        pytest.fail(
            "mcpd is installed on this machine; the system tests install and purge their own build: run `dpkg --purge mcpd` first"
        )
    dist = system_debs.host_dist()
    if dist is None:
        pytest.fail("this machine's distribution is not in packaging/targets")
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout
    deb = system_debs.build(dist, arch.strip())
    logs = tmp_path_factory.mktemp("system")
    ours = {
        "user": not exists(pwd.getpwnam, "mcpd"),
        "mcpd": not exists(grp.getgrnam, "mcpd"),
        "render": not exists(grp.getgrnam, "render"),
    }
    before = mcpd_files()
    root = Path(tempfile.mkdtemp(prefix="mcpd-test-", dir="/var/lib"))
    root.chmod(0o755)  # mkdtemp makes it 0700: the mcpd user must reach the board
    board: SimulatedBoard | None = None
    ns: Namespace | None = None
    try:
        board = SimulatedBoard(root / "board", logs / "simulator.log")
        # The namespace has its own /tmp: a checkout under /tmp (a CI clone) is not visible there.
        shutil.copy2(deb, root / deb.name)
        ns = Namespace(logs / "systemd.log")
        assert ns.wait_booted() in ("running", "degraded")
        # apt, as the README tells users to install it; dependencies are installed already.
        ns.run(
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "-o",
            "DPkg::Lock::Timeout=300",
            str(root / deb.name),
        )
        # The simulated board lives under /var/lib, which ProtectSystem=strict makes read-only.
        DROP_IN.mkdir(exist_ok=True)
        (DROP_IN / "system-test.conf").write_text(f"[Service]\nReadWritePaths={root}/board\n")
        ns.systemctl("daemon-reload")
        yield System(ns, board, root, deb, before)
    finally:
        shutil.rmtree(DROP_IN, ignore_errors=True)
        if ns is not None:
            ns.poweroff()
        if board is not None:
            board.stop()
        if installed():
            subprocess.run(["dpkg", "--purge", "mcpd"], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)
        if ours["user"] and exists(pwd.getpwnam, "mcpd"):
            subprocess.run(["userdel", "mcpd"], check=False)
        for group in ("mcpd", "render"):
            if ours[group] and exists(grp.getgrnam, group):
                subprocess.run(["groupdel", group], check=False)


def configure(system: System, limits: tuple[float, float]) -> None:
    high, low = limits
    # These tests are about temperature; the simulated RK3588 also governs on its power estimate
    # (11.6 W at full clocks under the simulator's sustained load, above the 9 W raise limit),
    # which would hold the caps below the maximum after a reload to RELEASE: power limits it
    # never reaches.
    CONFIG.write_text(
        f'[daemon]\nsysfs_root = "{system.root}/board"\n\n'
        f"[governor]\ntemp_high_c = {high}\ntemp_low_c = {low}\n"
        "power_high_w = 40.0\npower_low_w = 30.0\n"
    )


def state(system: System) -> dict[str, str]:
    return system.ns.show(
        "mcpd.service", "ActiveState", "SubState", "MainPID", "NRestarts", "StatusText", "Result"
    )


def running(system: System, limits: tuple[float, float] = THROTTLE) -> dict[str, str]:
    """Started with these limits (reloaded if it was running), and governing."""
    configure(system, limits)
    if state(system)["ActiveState"] == "active":
        system.ns.systemctl("reload", "mcpd.service")
    else:
        system.ns.systemctl("start", "mcpd.service")
    if limits == THROTTLE:
        wait_until(lambda: throttled(system), 30, "mcpd to lower every cap", interval=0.1)
    return state(system)


def throttled(system: System) -> bool:
    caps = system.board.caps()
    return all(caps[knob] < system.board.baseline[knob] for knob in caps)


def test_install_adds_the_user_enables_the_units_and_starts_nothing(system: System) -> None:
    ns = system.ns
    user = pwd.getpwnam("mcpd")
    assert user.pw_shell == "/usr/sbin/nologin"
    assert grp.getgrgid(user.pw_gid).gr_name == "mcpd"
    assert ns.systemctl("is-enabled", "mcpd.service", "mcpd.socket").split() == ["enabled"] * 2
    assert ns.systemctl("is-active", "mcpd.service", check=False).strip() == "inactive"
    assert ns.systemctl("is-active", "mcpd.socket", check=False).strip() == "inactive"
    conffiles = ns.run("dpkg-query", "-W", "-f", "${Conffiles}", "mcpd").stdout
    assert "/etc/mcpd/mcpd.toml" in conffiles
    assert "OK" in ns.run("mcpd", "check-config", str(CONFIG)).stdout
    assert ns.run("mcpd", "--version").stdout.startswith("mcpd ")
    assert list(
        Path("/opt/mcpd/lib").glob("python3.*/site-packages/mcpd/cli/__pycache__/__init__.*.pyc")
    )


def test_start_becomes_active_only_after_ready(system: System) -> None:
    ns = system.ns
    if state(system)["ActiveState"] != "inactive":
        ns.systemctl("stop", "mcpd.service")
    configure(system, THROTTLE)
    # The first sample is held back: mcpd's loop blocks reading the wedged sensor, so mcpd
    # cannot have sent READY=1 yet.
    # In systemd's mount namespace: the service started next gets a copy of it, wedge included.
    wedged = WedgedSensor(system.board, Path(f"/proc/{ns.pid}/ns/mnt"), system.root / "wedge.log")
    try:
        ns.systemctl("start", "--no-block", "mcpd.service")
        wait_until(lambda: state(system)["MainPID"] != "0", 30, "mcpd's main process", interval=0.1)
        time.sleep(3)
        before = state(system)
        assert (before["ActiveState"], before["StatusText"]) == ("activating", "")
        wait_until(wedged.blocked, 30, "mcpd to read the sensor", interval=0.1)
    finally:
        wedged.release()
    wait_until(
        lambda: state(system)["ActiveState"] == "active", 30, "mcpd to become active", interval=0.1
    )
    # READY=1 and the first STATUS= come in one message: active implies a status line.
    assert "MHz" in state(system)["StatusText"]
    assert "ready: rk3588" in ns.journal("mcpd.service")
    # The service's private copy of the wedge's mount outlives the wedge (a dead FUSE mount):
    # the next test starts a fresh one.
    ns.systemctl("stop", "mcpd.service")


def test_status_shows_the_status_line(system: System) -> None:
    running(system)
    text = system.ns.systemctl("status", "mcpd.service", "--no-pager", check=False)
    assert "Active: active (running)" in text
    status = next(line for line in text.splitlines() if line.strip().startswith("Status:"))
    assert "°C" in status
    assert "policy0" in status
    assert "MHz" in status


def test_the_socket_answers_health_ready(system: System) -> None:
    running(system)
    path = system.ns.path(SOCKET)
    assert http_status(path, "/v2/health/ready") == 200
    stat = path.stat()
    assert stat.st_mode & 0o777 == 0o660
    assert grp.getgrgid(stat.st_gid).gr_name == "mcpd"


def test_main_pid_is_the_governor_and_a_killed_serving_process_comes_back(system: System) -> None:
    before = running(system)
    main, ns, path = before["MainPID"], system.ns, system.ns.path(SOCKET)
    command = ns.run("cat", f"/proc/{main}/cmdline").stdout.split("\0")
    assert "mcpd.cli" in " ".join(command) and command[-2] == "run"
    serving = http_json(path, "/v2/mcpd/status")["serving"]
    child = str(serving["pid"])
    assert ns.run("cat", f"/proc/{child}/stat").stdout.split()[3] == main  # its parent
    # The governor runs real-time (set by the unit), serving with normal scheduling.
    assert "SCHED_FIFO" in ns.run("chrt", "-p", main).stdout
    assert "SCHED_OTHER" in ns.run("chrt", "-p", child).stdout
    cursor = ns.cursor()
    ns.run("kill", "-9", child)

    def replaced() -> bool:
        now = http_json(path, "/v2/mcpd/status")["serving"]
        return now["pid"] not in (None, int(child)) and now["restarts"] == serving["restarts"] + 1

    wait_until(replaced, 30, "a new serving process", interval=0.1)
    after = state(system)
    assert (after["MainPID"], after["NRestarts"]) == (main, before["NRestarts"])
    assert after["ActiveState"] == "active"
    assert f"serving process {child} exited (signal SIGKILL)" in ns.journal("mcpd.service", cursor)


# A raw HTTP client run inside the namespace, as whichever user runs it.
HTTP_CLIENT = r"""
import socket, sys
method, target, body = sys.argv[1], sys.argv[2], sys.argv[3].encode()
with socket.socket(socket.AF_UNIX) as s:
    s.settimeout(30)
    s.connect("/run/mcpd/mcpd.sock")
    head = f"{method} {target} HTTP/1.1\r\nHost: mcpd\r\nConnection: close\r\n"
    s.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
head, _, rest = data.partition(b"\r\n\r\n")
print(head.split(b" ")[1].decode(), rest.decode())
"""
SHM_CLIENT = "mcpd-test-client"


def request_as(
    system: System, user: str | None, method: str, target: str, body: str = ""
) -> tuple[int, str]:
    """(status, body) of one request over the socket, as `user` (None: root)."""
    become = (
        [] if user is None else ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"]
    )
    out = system.ns.run(*become, "/usr/bin/python3", "-c", HTTP_CLIENT, method, target, body).stdout
    status, _, text = out.strip().partition(" ")
    return int(status), text


def test_shared_memory_is_only_for_users_the_real_unit_can_tell_apart(system: System) -> None:
    """Under PrivateUsers=yes every other user reads as nobody inside the service: such a client
    is refused (any region it registered would be every such user's), root is not."""
    running(system)
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "-G", "mcpd", SHM_CLIENT], check=True
    )
    key = f"mcpd-system-test-{os.getpid()}"
    obj = Path("/dev/shm") / key
    register = json.dumps({"key": key, "byte_size": 64})
    try:
        obj.write_bytes(bytes(64))
        obj.chmod(0o666)  # so that the mcpd user may open it at all
        os.chown(obj, pwd.getpwnam(SHM_CLIENT).pw_uid, -1)
        status, text = request_as(
            system, SHM_CLIENT, "POST", "/v2/systemsharedmemory/region/c/register", register
        )
        assert status == 400 and "is not visible to mcpd" in text, text
        os.chown(obj, 0, -1)
        assert (
            request_as(system, None, "POST", "/v2/systemsharedmemory/region/r/register", register)[
                0
            ]
            == 200
        )
        # Root's region is root's: the other user neither sees nor unregisters it.
        assert request_as(system, SHM_CLIENT, "GET", "/v2/systemsharedmemory/status") == (200, "[]")
        request_as(system, SHM_CLIENT, "POST", "/v2/systemsharedmemory/unregister")
        _, regions = request_as(system, None, "GET", "/v2/systemsharedmemory/status")
        assert [r["name"] for r in json.loads(regions)] == ["r"]
    finally:
        request_as(system, None, "POST", "/v2/systemsharedmemory/unregister")
        obj.unlink(missing_ok=True)
        subprocess.run(["userdel", SHM_CLIENT], check=False)


def test_the_descriptor_limit_is_the_units(system: System) -> None:
    pid = running(system)["MainPID"]
    limits = system.ns.run("cat", f"/proc/{pid}/limits").stdout
    assert re.search(r"Max open files\s+4096\s+4096", limits), limits


def test_reload_applies_a_changed_threshold(system: System) -> None:
    before = running(system, THROTTLE)
    configure(system, RELEASE)
    system.ns.systemctl("reload", "mcpd.service")
    wait_until(
        lambda: system.board.caps() == system.board.baseline, 30, "the caps to rise", interval=0.1
    )
    after = state(system)
    assert after["MainPID"] == before["MainPID"]
    assert after["NRestarts"] == before["NRestarts"]
    assert "configuration reloaded" in system.ns.journal("mcpd.service")


def test_reload_of_a_rejected_config_fails_and_the_running_one_stays(system: System) -> None:
    before = running(system, RELEASE)
    CONFIG.write_bytes(f'[daemon]\nsysfs_root = "{system.root}/board"\n'.encode() + b"\xff\n")
    try:
        result = system.ns.run("systemctl", "reload", "mcpd.service", check=False)
        assert result.returncode != 0
        after = state(system)
        assert (after["ActiveState"], after["MainPID"]) == ("active", before["MainPID"])
        assert f"{CONFIG}: not UTF-8 text" in system.ns.journal("mcpd.service")
    finally:
        configure(system, RELEASE)


def test_socket_activation_starts_mcpd_on_the_first_connection(system: System) -> None:
    running(system)
    system.ns.systemctl("stop", "mcpd.service")
    assert state(system)["ActiveState"] == "inactive"
    assert system.ns.systemctl("is-active", "mcpd.socket").strip() == "active"
    assert http_status(system.ns.path(SOCKET), "/v2/health/ready") == 200
    # The server answers from its start; the unit is active once the loop has sampled too.
    wait_until(
        lambda: state(system)["ActiveState"] == "active", 30, "mcpd to become active", interval=0.1
    )


def test_clients_are_never_refused_across_a_restart(system: System) -> None:
    before = running(system)
    path = system.ns.path(SOCKET)
    statuses: list[int] = []
    errors: list[str] = []
    done = threading.Event()

    def client() -> None:
        while not done.is_set():
            try:
                statuses.append(http_status(path, "/v2/health/ready"))
            except OSError as exc:
                errors.append(repr(exc))
            time.sleep(0.02)

    thread = threading.Thread(target=client)
    thread.start()
    try:
        time.sleep(0.5)
        system.ns.systemctl("restart", "mcpd.service")
        time.sleep(1.0)
    finally:
        done.set()
        thread.join(timeout=90)
    assert state(system)["MainPID"] != before["MainPID"]
    assert errors == []
    assert len(statuses) >= 10
    assert set(statuses) == {200}


def test_watchdog_kills_a_hung_control_loop_and_restarts_mcpd(system: System) -> None:
    before = running(system)
    cursor = system.ns.cursor()
    # In the running service's own mount namespace: mounts made outside no longer reach it.
    service = system.ns.path(f"/proc/{before['MainPID']}/ns/mnt")
    wedged = WedgedSensor(system.board, service, system.root / "wedge.log")
    try:
        fired = lambda: "Watchdog timeout" in system.ns.journal("mcpd.service", cursor)  # noqa: E731
        wait_until(fired, 60, "the watchdog to fire", interval=0.1)
    finally:
        # A read hung in a driver (here in FUSE) is not interruptible: the aborted mcpd can only
        # go once it is answered, as with a driver that finally times out.
        wedged.release()
    wait_until(
        lambda: state(system)["MainPID"] != before["MainPID"], 60, "mcpd to restart", interval=0.1
    )
    wait_until(
        lambda: state(system)["ActiveState"] == "active", 60, "mcpd to come back", interval=0.1
    )
    assert int(state(system)["NRestarts"]) == int(before["NRestarts"]) + 1
    journal = system.ns.journal("mcpd.service", cursor)
    assert "Watchdog timeout" in journal
    assert "with signal SIGABRT" in journal
    assert "Failed with result 'watchdog'" in journal
    # The fault handler's stacks: the control loop thread was stuck reading a sensor.
    assert "mcpd/governor/loop.py" in journal
    assert "sensors/sysfs.py" in journal


def test_kill_9_restores_the_caps_through_exec_stop_post_and_restarts(system: System) -> None:
    before = running(system)
    cursor = system.ns.cursor()
    system.ns.run("kill", "-9", before["MainPID"])
    restored = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        restored = restored or system.board.caps() == system.board.baseline
        now = state(system)
        if now["ActiveState"] == "active" and now["MainPID"] != before["MainPID"]:
            break
        time.sleep(0.02)
    assert restored, "the baseline caps were never back between the kill and the restart"
    assert int(state(system)["NRestarts"]) == int(before["NRestarts"]) + 1
    journal = system.ns.journal("mcpd.service", cursor)
    assert "status=9/KILL" in journal
    assert "restored policy0" in journal
    wait_until(lambda: throttled(system), 30, "the restarted mcpd to govern", interval=0.1)


def test_stop_restores_the_baseline_caps_and_hands_the_knobs_back(system: System) -> None:
    running(system)
    mcpd_uid = pwd.getpwnam("mcpd").pw_uid
    assert system.board.owners() == {mcpd_uid}
    system.ns.systemctl("stop", "mcpd.service")
    after = state(system)
    assert (after["ActiveState"], after["Result"]) == ("inactive", "success")
    assert system.board.caps() == system.board.baseline
    assert system.board.owners() == {0}
    assert not Path("/var/lib/mcpd/baseline.json").exists()


def test_purge_leaves_nothing_behind(system: System) -> None:
    running(system)
    files = system.ns.run("dpkg-query", "-L", "mcpd").stdout.split()
    shutil.rmtree(DROP_IN)  # the test's own, not the package's
    system.ns.systemctl("daemon-reload")
    system.ns.run("env", "DEBIAN_FRONTEND=noninteractive", "dpkg", "--purge", "mcpd")
    assert not installed()
    # prerm stopped mcpd, so ExecStopPost= put the caps back before the files went.
    assert system.board.caps() == system.board.baseline
    assert system.board.owners() == {0}
    own = [f for f in files if f.startswith(("/opt/mcpd", "/etc/mcpd")) or "mcpd" in Path(f).name]
    assert own
    assert [f for f in own if Path(f).exists()] == []
    assert not system.ns.path("/run/mcpd").exists()
    assert mcpd_files() - system.before == set()
    # The system user stays (Debian's practice for system users), locked, with no shell.
    assert pwd.getpwnam("mcpd").pw_shell == "/usr/sbin/nologin"
