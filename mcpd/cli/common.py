"""What several `mcpd` commands share: the --config option and the config it names."""

from __future__ import annotations

import argparse

from mcpd import config


def add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help=f"config file (default {config.DEFAULT_PATH} if present)")


def load_config(path: str | None) -> config.Config:
    """The given file; else /etc/mcpd/mcpd.toml if it exists; else the defaults."""
    if path is not None:
        return config.load(path)
    if config.DEFAULT_PATH.exists():
        return config.load(config.DEFAULT_PATH)
    return config.Config()
