"""`mcpd run`: the daemon (what systemd runs), on the board or on a simulated one."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcpd import config
from mcpd.cli.common import add_config, add_topology, topology
from mcpd.governor import realtime
from mcpd.subcommands import Subcommands


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    from mcpd.sim import PROFILES

    parser = commands.add_parser(
        "run", help="run the daemon (under systemd, or on a simulated board)"
    )
    add_config(parser)
    parser.add_argument(
        "--simulate",
        choices=sorted(PROFILES),
        metavar="PROFILE",
        help=f"run on a simulated board: {', '.join(sorted(PROFILES))}",
    )
    parser.add_argument(
        "--sim-root", help="folder for the simulated board (default: a temporary one)"
    )
    parser.add_argument(
        "--sim-load", default="sustained", help="idle, sustained or bursts[:ON/OFF]"
    )
    parser.add_argument(
        "--sim-speed", type=float, default=1.0, help="simulated thermal time per wall second"
    )
    parser.add_argument("--sim-fault", action="append", default=[], help="as `mcpd sim --fault`")
    add_topology(parser, "--sim-topology")
    parser.add_argument("--live", action="store_true", help="print a status line every second")
    parser.set_defaults(default_level="info")
    return parser


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


class _SimulatedBoard:
    """`mcpd run --simulate`: the board is built under its root only once the daemon has claimed
    its folders, runs in a thread of its own, and a temporary root goes when the daemon stops (or
    at once, when the simulator refuses the options)."""

    def __init__(self, args: argparse.Namespace) -> None:
        """Raises ValueError for options the simulator cannot take."""
        from mcpd.sim import MEMORY_DIR, PROFILES, LoadSchedule, Simulator
        from mcpd.sim.faults import parse as parse_fault

        self.temporary = args.sim_root is None
        self.root = Path(args.sim_root or tempfile.mkdtemp(prefix="mcpd-sim-", dir=MEMORY_DIR))
        try:
            self.simulator = Simulator(
                PROFILES[args.simulate],
                self.root,
                speed=args.sim_speed,
                load=LoadSchedule.parse(args.sim_load),
                faults=[parse_fault(spec) for spec in args.sim_fault],
                topology=topology(args.sim_topology),
            )
        except ValueError:
            self._remove_temporary_root()
            raise
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.simulator.build()
        self._thread = threading.Thread(
            target=self.simulator.run, args=(self._stop,), name="simulator", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._remove_temporary_root()

    def _remove_temporary_root(self) -> None:
        if self.temporary:
            shutil.rmtree(self.root, ignore_errors=True)


def _govern(
    args: argparse.Namespace, load: Callable[[], config.Config], board: _SimulatedBoard | None
) -> int:
    """The daemon, from claiming its folders to its exit status."""
    import asyncio

    from mcpd.governor import instance
    from mcpd.governor.daemon import Daemon
    from mcpd.listen import passed_by_systemd

    first = load()
    # Before anything is touched, the simulated board included (mcpd.governor.instance).
    with instance.claim(first.daemon, socket_passed=passed_by_systemd()):
        if board is not None:
            board.start()
        if args.log_level is None:
            logging.getLogger().setLevel(first.daemon.log_level.upper())
        live = (lambda text: print(text, flush=True)) if args.live else None
        # Before the daemon's first thread, which inherits it (mcpd.governor.realtime says why).
        scheduling = realtime.enter()
        daemon = Daemon(
            load, live=live, scheduling=scheduling, follow_log_level=args.log_level is None
        )
        return asyncio.run(daemon.run())


def run(args: argparse.Namespace) -> int:
    from mcpd.governor import instance
    from mcpd.listen import SocketError

    path = args.config or (
        config.DEFAULT_PATH if config.DEFAULT_PATH.exists() and not args.simulate else None
    )
    try:
        board = _SimulatedBoard(args) if args.simulate else None
    except ValueError as exc:
        print(f"mcpd run: {exc}", file=sys.stderr)
        return 2

    def load() -> config.Config:
        cfg = config.load(path) if path is not None else config.Config()
        return _simulated(cfg, board.root) if board is not None else cfg

    try:
        return _govern(args, load, board)
    except instance.AlreadyRunning as exc:
        print(f"mcpd run: {exc}; this one exits and touches nothing", file=sys.stderr)
        return 1
    except SocketError as exc:  # the socket or a TCP port taken: what it adopted is restored
        print(f"mcpd run: {exc}", file=sys.stderr)
        return 1
    finally:
        if board is not None:
            board.stop()
