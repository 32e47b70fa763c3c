"""`mcpd sim`: a simulated board under a folder, until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from mcpd.cli.common import add_topology, topology
from mcpd.subcommands import Subcommands

log = logging.getLogger("mcpd")


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    from mcpd.sim import PROFILES

    parser = commands.add_parser("sim", help="run a simulated board under a folder until SIGTERM")
    parser.add_argument("--profile", required=True, choices=sorted(PROFILES))
    parser.add_argument("--root", required=True, type=Path, help="folder to build the fake tree in")
    parser.add_argument(
        "--load",
        default="sustained",
        help="idle, sustained, bursts[:ON/OFF] or step:AT (default sustained)",
    )
    parser.add_argument(
        "--speed", type=float, default=1.0, help="simulated thermal time per wall second"
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        help="KIND:SENSOR[@START[+DURATION]] (wall-clock s) or fan-stop|dust|ambient:AMOUNT"
        "[@START[+DURATION]] (simulated s), repeatable",
    )
    parser.add_argument(
        "--ambient", type=float, default=25.0, help="air temperature, °C (default 25)"
    )
    add_topology(parser, "--topology")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.set_defaults(default_level="info")
    return parser


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def run(args: argparse.Namespace) -> int:
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
            topology=topology(args.topology),
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
