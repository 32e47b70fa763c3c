"""`mcpd probe`: a one-shot look at the board, and at the runtimes that could serve on it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mcpd.cli.common import add_config, load_config
from mcpd.subcommands import Subcommands


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "probe", help="show the board's platform, sensors and frequency domains"
    )
    parser.add_argument("--sysfs-root", help="read sysfs under this folder instead of the config's")
    add_config(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(default_level="error")
    return parser


def run(args: argparse.Namespace) -> int:
    from mcpd.governor.probe import format_table, probe

    cfg = load_config(args.config)
    root = args.sysfs_root or cfg.daemon.sysfs_root
    if not Path(root).is_dir():
        print(f"mcpd probe: sysfs root {root}: no such directory", file=sys.stderr)
        return 1
    s = cfg.sensors
    result = probe(
        root, s.governing_temperatures, s.governing_powers, power=s.power_options(), config=cfg
    )
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
