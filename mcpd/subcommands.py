"""How `mcpd` and `mcpctl` register their subcommands: one module per command, each with
`add_parser(commands)` (its name, help and options) and `run(args) -> int`, and one table per
program that lists them in the order of its --help."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Protocol, TypeAlias

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class Command(Protocol):
    def add_parser(self, commands: Subcommands) -> argparse.ArgumentParser: ...

    def run(self, args: argparse.Namespace) -> int: ...


def add_commands(parser: argparse.ArgumentParser, table: Sequence[Command]) -> None:
    """Each command of `table` as a subcommand of `parser`, run by its `run`."""
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in table:
        command.add_parser(commands).set_defaults(func=command.run)
