"""`mcpd`: the daemon and its admin commands."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from mcpd import __version__, config, logs, optimize
from mcpd.governor import domains, realtime
from mcpd.governor.baseline import Baseline, baseline_folders

log = logging.getLogger("mcpd")


def _load_config(path: str | None) -> config.Config:
    """The given file; else /etc/mcpd/mcpd.toml if it exists; else the defaults."""
    if path is not None:
        return config.load(path)
    if config.DEFAULT_PATH.exists():
        return config.load(config.DEFAULT_PATH)
    return config.Config()


def _simulated(cfg: config.Config, root: Path) -> config.Config:
    """Point the daemon at a simulated board; default paths move under its root too, so a demo
    never touches /run or /var/lib."""
    defaults = config.DaemonSection()
    update: dict[str, Any] = {"sysfs_root": str(root)}
    if cfg.daemon.state_dir == defaults.state_dir:
        update["state_dir"] = str(root / "var/lib/mcpd")
    if cfg.daemon.runtime_dir == defaults.runtime_dir:
        update["runtime_dir"] = str(root / "run/mcpd")
    if cfg.daemon.socket == defaults.socket:
        update["socket"] = str(root / "run/mcpd/mcpd.sock")
    return dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, **update))


def cmd_run(args: argparse.Namespace) -> int:
    import asyncio
    import shutil
    import tempfile

    from mcpd.governor import instance
    from mcpd.governor.daemon import Daemon
    from mcpd.listen import SocketError, passed_by_systemd
    from mcpd.sim import MEMORY_DIR, PROFILES, LoadSchedule, Simulator
    from mcpd.sim.faults import parse as parse_fault

    path = args.config or (
        config.DEFAULT_PATH if config.DEFAULT_PATH.exists() and not args.simulate else None
    )
    sim_root: Path | None = None
    simulator: Simulator | None = None
    if args.simulate:
        sim_root = Path(args.sim_root or tempfile.mkdtemp(prefix="mcpd-sim-", dir=MEMORY_DIR))
        try:
            simulator = Simulator(
                PROFILES[args.simulate],
                sim_root,
                speed=args.sim_speed,
                load=LoadSchedule.parse(args.sim_load),
                faults=[parse_fault(spec) for spec in args.sim_fault],
            )
        except ValueError as exc:
            print(f"mcpd run: {exc}", file=sys.stderr)
            return 2
    stop_sim = threading.Event()
    sim_thread: threading.Thread | None = None

    def load() -> config.Config:
        cfg = config.load(path) if path is not None else config.Config()
        return _simulated(cfg, sim_root) if sim_root is not None else cfg

    try:
        first = load()
        # Before anything is touched, the simulated board included (mcpd.governor.instance).
        with instance.claim(first.daemon, socket_passed=passed_by_systemd()):
            if simulator is not None:
                simulator.build()
                sim_thread = threading.Thread(
                    target=simulator.run, args=(stop_sim,), name="simulator", daemon=True
                )
                sim_thread.start()
            if args.log_level is None:
                logging.getLogger().setLevel(first.daemon.log_level.upper())
            live = (lambda text: print(text, flush=True)) if args.live else None
            # Before the daemon's first thread, which inherits it (mcpd.governor.realtime says why).
            scheduling = realtime.enter()
            daemon = Daemon(
                load, live=live, scheduling=scheduling, follow_log_level=args.log_level is None
            )
            return asyncio.run(daemon.run())
    except instance.AlreadyRunning as exc:
        print(f"mcpd run: {exc}; this one exits and touches nothing", file=sys.stderr)
        return 1
    except SocketError as exc:  # the socket or a TCP port taken: what it adopted is restored
        print(f"mcpd run: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_sim.set()
        if sim_thread is not None:
            sim_thread.join(timeout=5)
        if sim_root is not None and args.sim_root is None:
            shutil.rmtree(sim_root, ignore_errors=True)


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        cfg = config.load(args.file)
    except config.ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    problems = config.model_file_problems(cfg)
    if problems:
        print(config.ConfigError(str(args.file), problems), file=sys.stderr)
        return 1
    print(f"{args.file}: OK")
    return 0


def cmd_reload(args: argparse.Namespace) -> int:
    from mcpd.governor import reloading

    pid = args.pid or os.environ.get("MAINPID", "")
    if not pid.isdigit() or int(pid) <= 0:
        print("mcpd reload: give the daemon's process id (--pid, or $MAINPID)", file=sys.stderr)
        return 2
    # Not from the config file: the file being reloaded may be the broken one.
    given = args.runtime_dir or os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    folder = Path(given or config.DaemonSection().runtime_dir)
    try:
        verdict = reloading.request(int(pid), folder, args.timeout)
    except reloading.NoDaemon as exc:
        print(f"mcpd reload: {exc}", file=sys.stderr)
        return 2
    if verdict is None:
        print(f"mcpd reload: no verdict in {folder} within {args.timeout:g} s", file=sys.stderr)
        return 2
    print(verdict.message, file=sys.stdout if verdict.ok else sys.stderr)
    return 0 if verdict.ok else 1


def cmd_probe(args: argparse.Namespace) -> int:
    from mcpd.governor.probe import format_table, probe

    cfg = _load_config(args.config)
    root = args.sysfs_root or cfg.daemon.sysfs_root
    if not Path(root).is_dir():
        print(f"mcpd probe: sysfs root {root}: no such directory", file=sys.stderr)
        return 1
    s = cfg.sensors
    result = probe(root, s.governing_temperatures, s.governing_powers, power=s.power_options())
    result.update(_execution_providers(result["platform"]))
    result["openvino"] = _openvino_devices()
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


def _execution_providers(platform: str) -> dict[str, Any]:
    """onnxruntime's execution providers (null where it cannot be imported) and the warning for a
    Jetson without a GPU provider (README, "The GPU on Jetson"); imported only by this command."""
    try:
        from mcpd.serving.backends import onnxrt
    except ImportError:
        return {"execution_providers": None, "gpu_warning": None}
    available = onnxrt.available_providers()
    return {
        "execution_providers": available,
        "gpu_warning": onnxrt.gpu_missing(platform, available),
    }


def _openvino_devices() -> dict[str, Any] | None:
    """OpenVINO's version and devices (null without OpenVINO); imported only by this command, as
    onnxruntime is."""
    from mcpd.serving.backends import openvino

    return openvino.device_report()


def cmd_restore(args: argparse.Namespace) -> int:
    from mcpd.governor import instance

    cfg = _load_config(args.config)
    root = args.sysfs_root or cfg.daemon.sysfs_root
    folders: tuple[str, ...] = baseline_folders(cfg.daemon)
    if args.state_dir or args.runtime_dir:
        folders = tuple(f for f in (args.runtime_dir, args.state_dir) if f)
    try:
        # A daemon that holds the folders governs: the baseline is its own, and it restores the
        # caps itself when it stops. One that died holds nothing (mcpd.governor.instance).
        with instance.hold(folders):
            return _restore(folders, root)
    except instance.AlreadyRunning as exc:
        print(f"mcpd restore: {exc}; it restores the caps when it stops", file=sys.stderr)
        return 1


def _restore(folders: tuple[str, ...], root: str) -> int:
    baseline = Baseline.load(folders, root)
    if not baseline.entries:
        print("nothing to restore")
        return 0
    report = baseline.restore(domains.discover(root))
    for name in report.restored:
        print(f"restored {name}")
    for problem in report.problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if report.problems else 0


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def cmd_sim(args: argparse.Namespace) -> int:
    from mcpd.sim import PROFILES, LoadSchedule, Simulator
    from mcpd.sim.faults import parse as parse_fault

    try:
        if not -40.0 <= args.ambient <= 60.0:
            raise ValueError(f"--ambient {args.ambient:g}: expected -40 to 60 °C")
        load = LoadSchedule.parse(args.load)
        faults = [parse_fault(spec) for spec in args.fault]
        simulator = Simulator(
            PROFILES[args.profile],
            args.root,
            speed=args.speed,
            load=load,
            faults=faults,
            seed=args.seed,
            ambient_c=args.ambient,
        )
        simulator.build()
    except ValueError as exc:
        print(f"mcpd sim: {exc}", file=sys.stderr)
        return 2
    stop = _stop_on_signals()
    log.info(
        "simulating %s under %s (load %s, speed x%g)",
        args.profile,
        args.root,
        args.load,
        args.speed,
    )
    simulator.run(stop, args.step_ms / 1000)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from mcpd.sim import PROFILES

    parser = argparse.ArgumentParser(prog="mcpd", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mcpd {__version__}")
    parser.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the daemon (under systemd, or on a simulated board)")
    run.add_argument("--config", help=f"config file (default {config.DEFAULT_PATH} if present)")
    run.add_argument(
        "--simulate",
        choices=sorted(PROFILES),
        metavar="PROFILE",
        help=f"run on a simulated board: {', '.join(sorted(PROFILES))}",
    )
    run.add_argument("--sim-root", help="folder for the simulated board (default: a temporary one)")
    run.add_argument("--sim-load", default="sustained", help="idle, sustained or bursts[:ON/OFF]")
    run.add_argument(
        "--sim-speed", type=float, default=1.0, help="simulated thermal time per wall second"
    )
    run.add_argument("--sim-fault", action="append", default=[], help="as `mcpd sim --fault`")
    run.add_argument("--live", action="store_true", help="print a status line every second")
    run.set_defaults(func=cmd_run, default_level="info")

    check = commands.add_parser(
        "check-config", help="validate a config file; non-zero exit if invalid"
    )
    check.add_argument("file", type=Path)
    check.set_defaults(func=cmd_check_config, default_level="warning")

    probe = commands.add_parser(
        "probe", help="show the board's platform, sensors and frequency domains"
    )
    probe.add_argument("--sysfs-root", help="read sysfs under this folder instead of the config's")
    probe.add_argument("--config", help=f"config file (default {config.DEFAULT_PATH} if present)")
    probe.add_argument("--json", action="store_true", help="machine-readable output")
    probe.set_defaults(func=cmd_probe, default_level="error")

    reload = commands.add_parser(
        "reload", help="reload the running daemon's config and wait for its verdict (ExecReload)"
    )
    reload.add_argument("--pid", help="the daemon's process id (default $MAINPID, as systemd sets)")
    reload.add_argument(
        "--runtime-dir",
        help="the daemon's [daemon] runtime_dir, where it writes its verdict "
        "(default $RUNTIME_DIRECTORY, as systemd sets, else /run/mcpd)",
    )
    reload.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default 60)")
    reload.set_defaults(func=cmd_reload, default_level="warning")

    restore = commands.add_parser("restore", help="write the saved baseline caps back (idempotent)")
    restore.add_argument("--config", help=f"config file (default {config.DEFAULT_PATH} if present)")
    restore.add_argument("--sysfs-root")
    restore.add_argument(
        "--state-dir", help="the baseline's folder on disk (default: the config's)"
    )
    restore.add_argument("--runtime-dir", help="its folder on tmpfs (default: the config's)")
    restore.set_defaults(func=cmd_restore, default_level="info")

    sim = commands.add_parser("sim", help="run a simulated board under a folder until SIGTERM")
    sim.add_argument("--profile", required=True, choices=sorted(PROFILES))
    sim.add_argument("--root", required=True, type=Path, help="folder to build the fake tree in")
    sim.add_argument(
        "--load",
        default="sustained",
        help="idle, sustained, bursts[:ON/OFF] or step:AT (default sustained)",
    )
    sim.add_argument(
        "--speed", type=float, default=1.0, help="simulated thermal time per wall second"
    )
    sim.add_argument(
        "--fault",
        action="append",
        default=[],
        help="KIND:SENSOR[@START[+DURATION]] (wall-clock s) or fan-stop|dust|ambient:AMOUNT"
        "[@START[+DURATION]] (simulated s), repeatable",
    )
    sim.add_argument("--ambient", type=float, default=25.0, help="air temperature, °C (default 25)")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--step-ms", type=float, default=50.0)
    sim.set_defaults(func=cmd_sim, default_level="info")

    optimize.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.setup(args.log_level or args.default_level, os.environ, sys.stderr)
    try:
        return int(args.func(args))
    except config.ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
