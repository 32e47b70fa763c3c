"""`mcpd check-config`: validate a config file, its model files included."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mcpd import config
from mcpd.subcommands import Subcommands


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "check-config", help="validate a config file; non-zero exit if invalid"
    )
    parser.add_argument("file", type=Path)
    parser.set_defaults(default_level="warning")
    return parser


def run(args: argparse.Namespace) -> int:
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
