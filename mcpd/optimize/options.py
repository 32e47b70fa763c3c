"""`mcpd optimize`'s options: the command's arguments checked (a bad one is one line and exit 2),
with what only this machine can say: the runtimes installed, OpenVINO's device and what it runs
natively (plan.py decides from these)."""

from __future__ import annotations

import argparse
import math
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from mcpd.optimize import PRECISIONS, ROCKCHIP, TARGETS, plan
from mcpd.optimize.background import RUNTIMES
from mcpd.optimize.interface import OptimizeError
from mcpd.optimize.rockchip import toolkit_python

LAYER_SAMPLES = 3  # held-out samples the toolkit's per-layer analysis runs on (each layer's worst)


@dataclass(frozen=True)
class Options:
    target: str = "cpu"
    precision: str = "auto"
    min_cosine: float = 0.98
    min_top1: float = 0.97
    budget_s: float = 150.0
    toolkit: Path | None = None  # rknn-toolkit2's python, for the Rockchip NPU targets
    layer_samples: int = 0  # the toolkit's per-layer analysis on this many held-out samples
    runtimes: tuple[str, ...] = ("onnxruntime",)
    device: str = "CPU"  # where OpenVINO's candidates run
    capabilities: tuple[str, ...] = ()  # what that device runs natively (OpenVINO's list)


def from_args(args: argparse.Namespace) -> Options:
    """The command's options, each checked (OptimizeError names a bad one)."""
    if args.target not in TARGETS:
        raise OptimizeError(
            f"--target {args.target!r}: unknown target (one of {', '.join(TARGETS)})"
        )
    if args.target in ROCKCHIP and args.precision not in ("auto", "int8", "fp16"):
        raise OptimizeError(
            f"--precision {args.precision}: the NPU targets take auto, int8 or fp16"
        )
    if args.precision not in PRECISIONS:
        raise OptimizeError(
            f"--precision {args.precision!r}: unknown precision (one of {', '.join(PRECISIONS)})"
        )
    for flag, value in (("--min-cosine", args.min_cosine), ("--min-top1", args.min_top1)):
        if not 0.0 <= value <= 1.0:
            raise OptimizeError(f"{flag} {value}: must be between 0 and 1")
    if not (math.isfinite(args.budget) and args.budget > 0):
        raise OptimizeError(f"--budget {args.budget}: must be a positive number of seconds")
    if args.layer_analysis and args.target not in ROCKCHIP:
        raise OptimizeError(
            f"--layer-analysis: rknn-toolkit2's analysis, for the NPU targets only (not "
            f"{args.target}; there the per-layer sensitivity is in the output when INT8 fails)"
        )
    toolkit = None
    if args.target in ROCKCHIP:
        toolkit = toolkit_python()
    runtimes, device, capabilities = _runtimes(args)
    return Options(
        args.target,
        args.precision,
        args.min_cosine,
        args.min_top1,
        args.budget,
        toolkit,
        LAYER_SAMPLES if args.layer_analysis else 0,
        runtimes,
        device,
        capabilities,
    )


def _runtimes(args: argparse.Namespace) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """The runtimes to measure, OpenVINO's device, and what that device runs natively."""
    if args.runtime is not None and args.target != "cpu":
        raise OptimizeError(f"--runtime: for --target cpu (not {args.target})")
    if args.device is not None and args.target != "openvino":
        raise OptimizeError(f"--device: OpenVINO's, for --target openvino (not {args.target})")
    device = args.device or "CPU"
    if not re.fullmatch(r"CPU|GPU(\.[0-9]{1,2})?|NPU", device):
        raise OptimizeError(
            f"--device {device!r}: one of CPU, GPU, GPU.N or NPU (the optimizer measures on the "
            "device it builds for, so not AUTO)"
        )
    runtimes: tuple[str, ...] | None = None
    if args.target == "openvino":
        runtimes = ("openvino",)
    elif args.target != "cpu":
        runtimes = ("onnxruntime",)
    elif args.runtime is not None:
        runtimes = tuple(dict.fromkeys(args.runtime.split(",")))
        unknown = [r for r in runtimes if r not in RUNTIMES]
        if unknown:
            raise OptimizeError(
                f"--runtime {args.runtime!r}: {unknown[0]!r} is not one of {', '.join(RUNTIMES)}"
            )
    capabilities = _capabilities(device) if runtimes is None or "openvino" in runtimes else None
    if runtimes is None:
        runtimes = plan.default_runtimes(capabilities is not None, platform.machine())
    if "openvino" not in runtimes:
        if args.precision == "bf16":
            raise OptimizeError("--precision bf16: OpenVINO's, which this run does not use")
        return runtimes, device, ()
    if capabilities is None:
        raise OptimizeError("OpenVINO is not installed: pip install 'mcpd[openvino]'")
    wanted = plan.openvino_candidates(device, capabilities, args.precision)
    if not wanted and (args.precision == "bf16" or runtimes == ("openvino",)):
        every = plan.openvino_candidates(device, capabilities, "auto")
        raise OptimizeError(
            f"--precision {args.precision}: OpenVINO on {device} builds {', '.join(every)} here "
            f"(it runs {', '.join(capabilities)} natively; bf16 needs AMX or AVX512-BF16)"
        )
    return runtimes, device, capabilities


def _capabilities(device: str) -> tuple[str, ...] | None:
    """What OpenVINO says `device` runs natively; None without OpenVINO."""
    from mcpd.serving.backends import openvino
    from mcpd.serving.errors import LoadError

    try:
        return tuple(openvino.capabilities(device))
    except LoadError:
        return None
    except RuntimeError as exc:  # OpenVINO has no such device here
        raise OptimizeError(f"--device {device}: {openvino.reason(exc)}") from None
