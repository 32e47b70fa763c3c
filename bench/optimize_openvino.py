"""bench/optimize.py's OpenVINO rows, built by hand the way issue 27 measured them, independently of
mcpd optimize's own choices: the ONNX model read by OpenVINO and written as IR to run at f32, at
bf16 (where the CPU runs it natively; otherwise a row that says why it does not apply), and NNCF's
post-training INT8 with its defaults (its float operations at OpenVINO's default precision), plus
NNCF's TRANSFORMER model type where the graph has attention. Each IR is timed and checked like
every other row (mcpd.optimize.measure runs an .xml through OpenVINO at its stored precision).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from mcpd.optimize.plan import has_attention
from mcpd.serving.backends.openvino import capabilities, store_precision


def cpu_description() -> dict[str, Any]:
    """What decides each precision's cost here: the CPU's flags and what OpenVINO runs natively."""
    from mcpd.optimize.runners import cpu_flags

    return {
        "cpu_flags": cpu_flags(Path("/proc/cpuinfo").read_text()),
        "openvino_capabilities": capabilities("CPU"),
    }


def _save(model: Any, path: Path, precision: str | None) -> Path:
    import openvino

    if precision is not None:
        store_precision(model, precision)
    openvino.save_model(model, str(path), compress_to_fp16=False)
    return path


def rows(model: Path, name: str, calibration: list[np.ndarray], scratch: Path) -> list[dict]:
    import openvino

    os.environ["NNCF_CI"] = "1"  # NNCF's telemetry off (nncf/telemetry/wrapper.py)
    import nncf

    nncf.set_log_level(logging.ERROR)
    core = openvino.Core()
    found: list[dict[str, Any]] = []
    for precision in ("f32", "bf16"):
        label = f"OpenVINO {precision}"
        if precision == "bf16" and "BF16" not in capabilities("CPU"):
            why = "the CPU has no BF16 in OpenVINO's capabilities (needs AMX or AVX512-BF16)"
            found.append({"variant": label, "not_applicable": why, "runtime": "openvino"})
            continue
        path = _save(core.read_model(str(model)), scratch / f"hand-{precision}.xml", precision)
        found.append({"variant": label, "path": path, "runtime": "openvino"})
    dataset = nncf.Dataset([{name: s[np.newaxis]} for s in calibration])
    types = [("defaults", None)]
    if has_attention(onnx.load(str(model), load_external_data=False)):
        types.append(("transformer", nncf.ModelType.TRANSFORMER))
    for kind, model_type in types:
        label = f"OpenVINO INT8 (NNCF PTQ {kind})"
        started = time.monotonic()
        with contextlib.redirect_stdout(sys.stderr):
            quantized = nncf.quantize(
                core.read_model(str(model)),
                dataset,
                subset_size=len(calibration),
                model_type=model_type,
            )
        path = _save(quantized, scratch / f"hand-int8-{kind}.xml", None)
        seconds = time.monotonic() - started
        found.append({"variant": label, "path": path, "runtime": "openvino", "build_s": seconds})
        print(f"  {label}: built in {seconds:.1f} s", file=sys.stderr, flush=True)
    return found
