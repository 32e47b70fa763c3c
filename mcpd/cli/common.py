"""What several `mcpd` commands share: the --config option and the config it names."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mcpd import config

if TYPE_CHECKING:
    from mcpd.sim.topology import Topology


def add_topology(parser: argparse.ArgumentParser, option: str) -> None:
    parser.add_argument(
        option,
        choices=["profile", "host"],
        default="profile",
        help="the board's CPU topology: the profile's, or this machine's (so that the placement "
        "plan names CPUs this machine has)",
    )


def topology(choice: str) -> Topology | None:
    """The simulated board's CPU topology: its profile's ("profile") or this machine's ("host")."""
    from mcpd.sim.topology import host

    return host() if choice == "host" else None


def add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help=f"config file (default {config.DEFAULT_PATH} if present)")


def load_config(path: str | None) -> config.Config:
    """The given file; else /etc/mcpd/mcpd.toml if it exists; else the defaults."""
    if path is not None:
        return config.load(path)
    if config.DEFAULT_PATH.exists():
        return config.load(config.DEFAULT_PATH)
    return config.Config()
