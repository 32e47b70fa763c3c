"""The daemon as systemd runs it: notify protocol, signals, baseline restore, reload."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import PROJECT
from tests.support.boards import NPU, POLICY4
from tests.support.daemon import RunningDaemon, mcpd_run

if TYPE_CHECKING:
    from mcpd.governor.daemon import Daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Callable[..., RunningDaemon]]:
    started: list[RunningDaemon] = []

    def start(
        config: str = "", *args: str, watchdog_usec: int = 0, profile: str = "rk3588"
    ) -> RunningDaemon:
        config = config or f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
        started.append(
            RunningDaemon(tmp_path, config, *args, watchdog_usec=watchdog_usec, profile=profile)
        )
        return started[-1]

    yield start
    for running in started:
        running.close()


def test_ready_status_watchdog_throttle_and_clean_stop(
    daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    d = daemon(watchdog_usec=1_000_000)
    ready = d.receive(lambda m: m.startswith("READY=1"))
    assert "\nSTATUS=" in ready and "policy4 2400" in ready
    d.receive(lambda m: m == "WATCHDOG=1")
    d.wait_for(lambda: d.cap(POLICY4) < 2400000)  # the simulated board passed 85 °C
    status = d.receive(lambda m: m.startswith("STATUS=") and ("lowering" in m or "holding" in m))
    assert "°C" in status and "W est." in status  # RK3588: no meter, the estimate governs
    assert (tmp_path / "state/baseline.json").exists()
    d.process.send_signal(signal.SIGTERM)
    assert d.process.wait(timeout=15) == 0
    d.receive(lambda m: m == "STOPPING=1", timeout=1)
    assert (d.cap(POLICY4), d.cap(NPU)) == (2400000, 1000000000)
    assert not (tmp_path / "state/baseline.json").exists()
    log = d.log.read_text()
    assert "ready: rk3588 (Radxa ROCK 5B)" in log
    assert "lower: policy0 1800 -> " in log and "(temperature " in log  # one line per decision
    assert "baseline caps restored" in log


def test_kill_9_leaves_the_baseline_for_mcpd_restore(
    daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    d = daemon()
    d.receive(lambda m: m.startswith("READY=1"))
    d.wait_for(lambda: d.cap(POLICY4) < 2400000)
    d.process.kill()
    d.process.wait(timeout=10)
    throttled = d.cap(POLICY4)
    assert throttled < 2400000
    saved = json.loads((tmp_path / "state/baseline.json").read_text())
    assert saved["domains"]["policy4"]["value"] == "2400000"
    restore = [
        sys.executable,
        "-m",
        "mcpd",
        "restore",
        "--config",
        str(d.config),
        "--sysfs-root",
        str(d.root),
    ]
    result = subprocess.run(restore, cwd=PROJECT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "restored policy4" in result.stdout
    assert d.cap(POLICY4) == 2400000


def test_deeply_nested_state_files_are_set_aside_and_the_daemon_governs(
    daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    """Issue 26: a baseline or learned power of 100 000 '[' ended `mcpd run` with a RecursionError
    (x86-amd: metered, so the adaptive policy loads what it learned)."""
    state = tmp_path / "state"
    state.mkdir()
    for name in ("baseline.json", "learned-power.json"):
        (state / name).write_text("[" * 100_000)
    d = daemon(
        f'[daemon]\nstate_dir = "{state}"\n[governor]\npolicy = "adaptive"\n', profile="x86-amd"
    )
    d.receive(lambda m: m.startswith("READY=1"))
    d.wait_for(lambda: "learning from scratch" in d.log.read_text())
    log = d.log.read_text()
    assert "corrupt (nested deeper than 32 levels) baseline set aside" in log
    assert f"learned power {state / 'learned-power.json'}: nested deeper than 32 levels" in log
    assert (state / "baseline.json.corrupt").exists()
    assert json.loads((state / "baseline.json").read_text())["domains"]  # saved afresh
    d.process.send_signal(signal.SIGTERM)
    assert d.process.wait(timeout=15) == 0
    assert "Traceback" not in d.log.read_text()


def test_sighup_applies_a_good_config_and_rejects_a_bad_one(
    daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    state = f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
    d = daemon(state)
    d.receive(lambda m: m.startswith("READY=1"))
    d.wait_for(lambda: d.cap(POLICY4) < 2400000)
    # Cool by temperature and by power (the simulated RK3588 governs on its power estimate too).
    cool = "temp_high_c = 110.0\ntemp_low_c = 100.0\npower_high_w = 40.0\npower_low_w = 30.0\n"
    d.config.write_text(state + "[governor]\n" + cool)
    d.process.send_signal(signal.SIGHUP)
    d.receive(lambda m: m.startswith("RELOADING=1"))
    d.receive(lambda m: m.startswith("READY=1"))
    d.wait_for(lambda: d.cap(POLICY4) == 2400000)  # everything is now "cool": raised back
    d.config.write_text(state + "[governor]\ntemp_high_c = 'hot'\n")
    d.process.send_signal(signal.SIGHUP)
    d.receive(lambda m: m.startswith("RELOADING=1"))
    d.receive(lambda m: m.startswith("READY=1"))
    d.wait_for(lambda: "reload rejected" in d.log.read_text())
    d.receive(lambda m: m.startswith("STATUS="), timeout=3)  # still governing
    assert d.cap(POLICY4) == 2400000  # the good config stays in force
    log = d.log.read_text()
    assert f"{d.config}: governor.temp_high_c: expected a valid number, got 'hot'" in log
    d.process.send_signal(signal.SIGTERM)
    assert d.process.wait(timeout=15) == 0


def test_invalid_config_at_start_exits_with_the_problem(tmp_path: Path) -> None:
    config = tmp_path / "mcpd.toml"
    config.write_text("[sampling]\ntemperature_ms = 0\n")
    result = subprocess.run(
        mcpd_run(config, "--simulate", "rk3588"),
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert (
        f"{config}: sampling.temperature_ms: expected greater than or equal to 10, got 0"
        in result.stderr
    )


def test_a_control_loop_thread_that_ends_takes_the_daemon_down_for_systemd(tmp_path: Path) -> None:
    """The main task waits on events only; the loop thread's end must be one of them."""
    config = tmp_path / "mcpd.toml"
    config.write_text(f'[daemon]\nruntime_dir = "{tmp_path / "run"}"\n')
    script = (
        "import sys\n"
        "from mcpd.governor import loop\n"
        "def run(self, stop):\n"
        "    self.ready.set()\n"
        "    raise SystemExit  # a BaseException gets past the tick's own handler\n"
        "loop.ControlLoop.run = run\n"
        "from mcpd.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    command = [sys.executable, "-c", script, "run", "--config", str(config)]
    command += ["--simulate", "rk3588", "--sim-root", str(tmp_path / "board")]
    result = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "the control loop thread ended; exiting so that systemd restarts mcpd" in result.stderr


def daemon_on_a_simulated_rk3588(tmp_path: Path, **sections: Any) -> Daemon:
    """The daemon object, not started, on a simulated RK3588 tree built under `tmp_path` (by the
    first call: a later one is a restart on the same board and boot)."""
    from mcpd import config
    from mcpd.governor.daemon import Daemon
    from mcpd.sim import PROFILES, Simulator

    sim = Simulator(PROFILES["rk3588"], tmp_path / "board")
    if not sim.root.exists():
        sim.build()
    daemon_section = {
        "sysfs_root": str(sim.root),
        "state_dir": str(tmp_path / "state"),
        "runtime_dir": str(tmp_path / "run"),
        "socket": str(tmp_path / "mcpd.sock"),
    }
    cfg = config.parse({"daemon": daemon_section, **sections})
    return Daemon(lambda: cfg)


def test_a_daemon_writes_at_stop_only_to_the_domains_it_adopted(tmp_path: Path) -> None:
    """Issue 26: a daemon restored every entry of the copies it read, adopted or not (a second
    instance restored the first's). Here a predecessor was killed with the NPU throttled, and its
    successor's config leaves the NPU alone: the NPU is not its to write; its original stays in
    the copies for `mcpd restore` (ExecStopPost)."""
    import asyncio

    from mcpd import config

    predecessor = daemon_on_a_simulated_rk3588(tmp_path)
    predecessor.loop.start()  # adopts every domain and saves the originals; then kill -9
    (tmp_path / "board" / NPU).write_text("300000000")
    (tmp_path / "board" / POLICY4).write_text("816000")
    daemon = daemon_on_a_simulated_rk3588(
        tmp_path, governor={"domains": {"fdab0000.npu": {"enabled": False}}}
    )

    class StopAtOnce:
        async def start(self) -> None:
            daemon._stop.set()

        async def stop(self) -> None: ...

        async def reload(self, config: config.Config) -> None: ...

    daemon.services = [StopAtOnce()]
    assert asyncio.run(daemon.run()) == 0
    assert (tmp_path / "board" / POLICY4).read_text() == "2400000"
    assert (tmp_path / "board" / NPU).read_text() == "300000000"
    for folder in ("run", "state"):
        saved = json.loads((tmp_path / folder / "baseline.json").read_text())["domains"]
        assert saved == {
            "fdab0000.npu": {
                "path": "sys/class/devfreq/fdab0000.npu/max_freq",
                "value": "1000000000",
            }
        }


def test_runtime_commands_pause_resume_and_profile(tmp_path: Path) -> None:
    from mcpd.events import Event

    daemon = daemon_on_a_simulated_rk3588(
        tmp_path,
        governor={"profiles": {"quiet": {"temp_high_c": 60.0, "temp_low_c": 50.0}}},
    )
    events: list[Event] = []
    daemon.events.subscribe(events.append)
    assert daemon.command("pause", {}) == {"ok": True, "paused": True}
    assert daemon.loop.paused
    assert daemon.command("resume", {}) == {"ok": True, "paused": False}
    assert daemon.command("profile", {"name": "quiet"}) == {"ok": True, "profile": "quiet"}
    daemon.loop.tick(time.monotonic() + 1.0)
    assert daemon.loop.settings.params.temp_high_c == 60.0
    assert daemon.status()["governor"]["profile"] == "quiet"
    assert daemon.command("profile", {"name": "loud"}) == {
        "ok": False,
        "error": "unknown profile 'loud'; defined: default, quiet",
    }
    assert (
        daemon.command("reboot", {})["error"]
        == "unknown command 'reboot'; allowed: pause, resume, profile"
    )
    assert [e.message for e in events] == [
        "governor paused by command",
        "governor resumed by command",
        "governor profile 'quiet' set by command",
    ]


def test_the_first_samples_are_taken_before_the_services_start(tmp_path: Path) -> None:
    """The first tick must not share the interpreter with the services' start (the serving
    process spawned, the first status built): it was the run's slowest sample-to-write. And the
    first status document the services publish has the board in it."""
    import asyncio

    from mcpd import config

    daemon = daemon_on_a_simulated_rk3588(tmp_path)
    seen: list[tuple[bool, float | None]] = []

    class Recorder:
        async def start(self) -> None:
            seen.append((daemon.loop.ready.is_set(), daemon.status()["temperature_c"]))
            daemon._stop.set()

        async def stop(self) -> None: ...

        async def reload(self, config: config.Config) -> None: ...

    daemon.services = [Recorder()]
    assert asyncio.run(daemon.run()) == 0
    assert len(seen) == 1 and seen[0][0] and seen[0][1] is not None


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="pinning to one CPU of one changes nothing"
)
def test_the_calling_thread_gets_its_cpus_back_when_the_daemon_ends(tmp_path: Path) -> None:
    """The governor runs on the plan's CPU (an RK3588's first A55) and gives the thread back when
    run() returns: a daemon run in the tests' process left it on CPU 0 for every later test."""
    import asyncio

    from mcpd import config

    before = os.sched_getaffinity(0)
    daemon = daemon_on_a_simulated_rk3588(tmp_path)
    during: list[set[int]] = []

    class Recorder:
        async def start(self) -> None:
            during.append(os.sched_getaffinity(0))
            daemon._stop.set()

        async def stop(self) -> None: ...

        async def reload(self, config: config.Config) -> None: ...

    daemon.services = [Recorder()]
    assert asyncio.run(daemon.run()) == 0
    assert during == [{0}]
    assert os.sched_getaffinity(0) == before
