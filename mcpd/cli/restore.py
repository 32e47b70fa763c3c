"""`mcpd restore`: write the saved baseline caps back (systemd's ExecStopPost after a crash)."""

from __future__ import annotations

import argparse
import sys

from mcpd.cli.common import add_config, load_config
from mcpd.governor import domains
from mcpd.governor.baseline import Baseline, baseline_folders
from mcpd.subcommands import Subcommands


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    parser = commands.add_parser("restore", help="write the saved baseline caps back (idempotent)")
    add_config(parser)
    parser.add_argument("--sysfs-root")
    parser.add_argument("--state-dir", help="the baseline's folder on disk (default: the config's)")
    parser.add_argument("--runtime-dir", help="its folder on tmpfs (default: the config's)")
    parser.set_defaults(default_level="info")
    return parser


def run(args: argparse.Namespace) -> int:
    from mcpd.governor import instance

    cfg = load_config(args.config)
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
