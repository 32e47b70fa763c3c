"""What `mcpd bench` runs a model file with: onnxruntime (threads) and OpenVINO (precision,
threads, streams), planned purely from the command's lists and what the CPU can do, then opened
as runners that each stream of a measurement calls.

OpenVINO compiles through the serving backend's own open_compiled, so a row is what serving (at
one stream) would run. A precision the CPU does not run natively (bf16 without AMX or
AVX512-BF16: no BF16 in OpenVINO's OPTIMIZATION_CAPABILITIES) is not measured: OpenVINO would
quietly run it at f32, and the row would lie. It is reported as not applicable instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from mcpd.config import OpenVinoOptions
from mcpd.optimize.interface import (
    OptimizeError,
    TensorSpec,
    interface,
    load,
    openvino_interface,
)
from mcpd.optimize.measure import session
from mcpd.serving.backends import openvino
from mcpd.serving.errors import LoadError

PRECISIONS = ("auto", "f32", "bf16", "f16")
"""OpenVINO's inference precision hints (`[models.openvino] precision`)."""
NATIVE = {"bf16": "BF16", "f16": "FP16"}
"""The OPTIMIZATION_CAPABILITIES entry a precision needs to run as itself."""
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
             "amx_bf16", "amx_fp16")  # fmt: skip
"""The /proc/cpuinfo flags that decide how fast each precision runs, stated with every sweep."""


@dataclass(frozen=True)
class Setting:
    runtime: str
    threads: int
    precision: str | None = None
    """OpenVINO's inference precision hint; None for onnxruntime (the file's own)."""
    streams: int = 1


@dataclass(frozen=True)
class NotApplicable:
    runtime: str
    precision: str
    reason: str


def runtimes_of(path: Path, wanted: Sequence[str]) -> list[str]:
    """The runtimes of `wanted` that read the file: .xml is OpenVINO's alone."""
    return [r for r in wanted if r == "openvino" or path.suffix.lower() != ".xml"]


def plan(
    runtimes: Sequence[str],
    threads: Sequence[int],
    precisions: Sequence[str],
    streams: Sequence[int],
    capabilities: Sequence[str],
) -> tuple[list[Setting], list[NotApplicable]]:
    """Every setting to measure, and the precisions left out because the CPU lacks them. A stream
    needs a thread of its own, so OpenVINO's streams go up to its threads."""
    settings: list[Setting] = []
    skipped = [
        NotApplicable(
            "openvino",
            precision,
            f"the CPU has no {NATIVE[precision]} in OpenVINO's OPTIMIZATION_CAPABILITIES "
            f"({', '.join(capabilities)})"
            + ("; bf16 needs AMX or AVX512-BF16" if precision == "bf16" else ""),
        )
        for precision in precisions
        if precision in NATIVE and NATIVE[precision] not in capabilities
    ]
    for runtime in runtimes:
        for count in threads:
            if runtime == "onnxruntime":
                settings.append(Setting(runtime, count))
                continue
            settings += [
                Setting(runtime, count, precision, n)
                for precision in precisions
                if precision not in {s.precision for s in skipped}
                for n in streams
                if n <= count
            ]
    return settings, skipped


def cpu_flags(cpuinfo: str) -> list[str]:
    """Which of CPU_FLAGS the first processor of /proc/cpuinfo's text has."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            present = set(line.partition(":")[2].split())
            return [flag for flag in CPU_FLAGS if flag in present]
    return []


def inputs_of(path: Path) -> tuple[TensorSpec, ...]:
    """The file's inputs: an ONNX file's through onnx, an IR's through OpenVINO."""
    if path.suffix.lower() != ".xml":
        return interface(load(path)).inputs
    return openvino_interface(path).inputs


def openvino_capabilities() -> list[str] | None:
    """The CPU's OPTIMIZATION_CAPABILITIES, or None without OpenVINO."""
    try:
        return openvino.capabilities("CPU")
    except LoadError:
        return None


Call = Callable[[], object]


@dataclass(frozen=True)
class Runner:
    calls: list[Call]
    """One inference of the feed per stream: what each of a measurement's threads repeats."""
    precision: str | None
    """The precision OpenVINO runs at (read back from the compiled model); None for onnxruntime."""


def open_runner(path: Path, setting: Setting, feed: dict[str, np.ndarray]) -> Runner:
    if setting.runtime == "onnxruntime":
        runner = session(path, setting.threads)
        return Runner([lambda: runner.run(None, feed)], None)
    precision = setting.precision or "auto"
    options = OpenVinoOptions(
        threads=setting.threads,
        precision=precision,  # type: ignore[arg-type]
        streams=setting.streams,
    )
    try:
        compiled = openvino.open_compiled(path, options)
    except LoadError as exc:
        raise OptimizeError(str(exc)) from None
    requests = [compiled.create_infer_request() for _ in range(setting.streams)]
    inputs = [feed[port.get_any_name()] for port in compiled.inputs]
    calls: list[Call] = [partial(request.infer, inputs) for request in requests]
    return Runner(calls, openvino.precision_in_force(compiled))
