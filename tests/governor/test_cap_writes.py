"""Cap writes the kernel refuses (issue 26): a target counts only once written and read back, a
refused write is retried at every decision and shown in the status, never taken as done."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

from mcpd.client import Client
from mcpd.governor.loop import ControlLoop
from mcpd.governor.loop_settings import LoopSettings
from tests.support.boards import NPU, POLICY4, RK_BSP_ZONES, rk3588_bsp
from tests.support.daemon import DaemonProcess
from tests.support.fakesys import FakeSysfs
from tests.support.loop import board_with_meter, cap, make_loop, run_for

Overlay = Callable[[Path, dict[str, str] | Path], Path]


def refuse_writes(fake: FakeSysfs, rel: str) -> str:
    """The cap file becomes a folder: every write to it fails (EISDIR). Returns its text."""
    text = (fake.root / rel).read_text()
    (fake.root / rel).unlink()
    (fake.root / rel).mkdir()
    return text


def accept_writes(fake: FakeSysfs, rel: str, text: str) -> None:
    shutil.rmtree(fake.root / rel)
    fake.file(rel, text)


def failure(loop: ControlLoop, name: str) -> object:
    (domain,) = [d for d in loop.snapshot.domains if d.name == name]
    return domain.write_failure


def test_a_refused_write_is_retried_at_every_decision_until_it_lands(fake: FakeSysfs) -> None:
    """The issue's board: hot, one cap refused for 1.5 s. Before, its target walked down to the
    floor unwritten and, once at the floor, nothing was written again: the cap stayed at the top
    for good while the state said "lowering"."""
    board_with_meter(fake, 90.0, 5.0)
    loop, clock, events = make_loop(fake.root)
    text = refuse_writes(fake, POLICY4)
    run_for(loop, clock, 1.5)
    control = loop.actuators.controls["policy4"]
    assert control.target == 2400.0  # in force: nothing was written
    assert cap(fake, NPU) == 800000000  # the other domain is governed meanwhile
    assert loop.snapshot.state == "write-failing"
    problem = failure(loop, "policy4")
    assert problem is not None and "Is a directory" in problem.error  # type: ignore[attr-defined]
    assert problem.since == 1.7e9 + 1000.0  # type: ignore[attr-defined]  # the first refusal
    assert problem.wanted_mhz == 1680.0  # type: ignore[attr-defined]  # one step from 2400
    assert failure(loop, "fdab0000.npu") is None
    faults = [e for e in events if e.kind == "fault" and e.data.get("domain") == "policy4"]
    assert len(faults) == 1  # once per episode
    accept_writes(fake, POLICY4, text)
    run_for(loop, clock, 0.1)  # the next decision writes it
    assert cap(fake, POLICY4) < 2400000
    run_for(loop, clock, 1.0)
    assert cap(fake, POLICY4) == 816000  # and governing goes on from there
    assert loop.snapshot.state == "lowering" and failure(loop, "policy4") is None
    faults = [e for e in events if e.kind == "fault" and e.data.get("domain") == "policy4"]
    assert [e.data.get("recovered", False) for e in faults] == [False, True]


def test_a_decision_that_holds_still_retries_the_write_it_decided(fake: FakeSysfs) -> None:
    board_with_meter(fake, 90.0, 5.0)
    loop, clock, events = make_loop(fake.root)
    text = refuse_writes(fake, POLICY4)
    loop.tick(clock.now)  # decided 1680 MHz, refused
    fake.file("sys/devices/virtual/thermal/thermal_zone0/temp", "80000\n")  # in the band: hold
    run_for(loop, clock, 0.45)  # refused again at every decision, the last at 0.4 s
    accept_writes(fake, POLICY4, text)
    run_for(loop, clock, 0.2)
    assert cap(fake, POLICY4) == 1608000
    assert loop.snapshot.state == "holding"
    (landed,) = [e for e in events if e.kind == "governor" and "policy4" in e.data["caps"]]
    assert "policy4 2400 -> 1608 MHz (refused for 0.5 s)" in landed.message


def test_adaptive_counts_only_levels_whose_caps_were_written(fake: FakeSysfs) -> None:
    """The adaptive policy's level bookkeeping: power measured while a cap of the level was
    refused is not learned as that level's (the board ran at other caps), and the level's caps
    are written as soon as the kernel takes them, not only when the level changes."""
    board_with_meter(fake, 90.0, 5.0)
    loop, clock, _ = make_loop(fake.root, LoopSettings(policy="adaptive"))
    text = refuse_writes(fake, POLICY4)
    run_for(loop, clock, 3.0)
    assert cap(fake, NPU) == 800000000  # the NPU went down to its floor
    learned = loop.policy.learned_w()
    assert learned and all(dict(caps)["policy4"] == 2400.0 for caps in learned)
    assert loop.snapshot.state == "write-failing"
    accept_writes(fake, POLICY4, text)
    run_for(loop, clock, 0.1)
    assert cap(fake, POLICY4) < 2400000
    caps = tuple((d.name, d.cap_mhz) for d in loop.snapshot.domains)
    assert caps in {level.caps_mhz for level in loop.policy.state.levels}  # the level it is at
    assert loop.snapshot.state != "write-failing"


def hot_rk3588(root: Path) -> None:
    fake = FakeSysfs(root)
    rk3588_bsp(fake)
    for number in range(len(RK_BSP_ZONES)):
        fake.file(f"sys/devices/virtual/thermal/thermal_zone{number}/temp", "90000\n")
    fake.file("proc/sys/kernel/random/boot_id", "0b3a9c2e-0000-4000-8000-000000000000\n")


def test_a_real_daemon_shows_an_ebusy_cap_and_writes_it_once_the_kernel_takes_it(
    tmp_path: Path, errno_overlay: Overlay
) -> None:
    """`mcpd run` on a hot RK3588 tree mounted through FUSE, whose policy4 cap answers write(2)
    with EBUSY until the rule is lifted: the status says which cap is refused and why, the other
    domains are governed meanwhile, and the cap lands at the next decision after."""
    source, rules = tmp_path / "board", tmp_path / "rules.json"
    source.mkdir()
    hot_rk3588(source)
    cap_file = POLICY4
    rules.write_text(json.dumps({cap_file: "write:EBUSY"}))
    root = errno_overlay(source, rules)
    sock, log = tmp_path / "mcpd.sock", tmp_path / "daemon.log"
    config = tmp_path / "mcpd.toml"
    config.write_text(
        f'[daemon]\nsysfs_root = "{root}"\nsocket = "{sock}"\n'
        f'state_dir = "{tmp_path / "state"}"\nruntime_dir = "{tmp_path / "run"}"\n'
    )
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(0.5)
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify.sock"))
    daemon = DaemonProcess(config, log=log, env=env, stop_timeout=15)

    def status_line(wanted: Callable[[str], bool]) -> str:
        def received() -> str | None:
            try:
                message = notify.recv(4096).decode()
            except TimeoutError:
                return None
            lines = message.splitlines()
            return next((s for s in lines if s.startswith("STATUS=") and wanted(s)), None)

        return daemon.wait_until(received, 20, "a matching STATUS line", interval=0)

    try:
        status_line(lambda s: "write-failing: policy4" in s and "policy6 816" in s)
        assert (source / cap_file).read_text() == "2208000\n"
        with Client(str(sock)) as client:
            document = client.status()
        assert document["governor"]["state"] == "write-failing"
        problem = document["domains"]["policy4"]["write_failure"]
        assert problem is not None and "Device or resource busy" in problem["error"]
        assert problem["since"] <= time.time() and problem["wanted_mhz"] < 2208.0
        assert document["domains"]["policy4"]["target_mhz"] == 2208.0
        assert document["domains"]["policy6"]["write_failure"] is None
        rules.write_text("{}")
        status_line(lambda s: "policy4 816" in s and "write-failing" not in s)
        assert (source / cap_file).read_text() == "816000"
    finally:
        daemon.stop()
        notify.close()
    text = log.read_text()
    assert text.count("Device or resource busy") == 1, text  # said once for the episode
    assert "policy4: cap writes work again" in text
