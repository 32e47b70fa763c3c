"""Does anything cheap make INT8 faster on this CPU? The ResNet-50-shaped model of
bench/optimize.py, quantized once per recipe (MinMax ranges, calibrated once), and the
U8S8 QDQ model under a few onnxruntime session settings, all timed side by side in one rotation
(batch 1, medians) against FP32, with each variant's accuracy on held-out samples.

    .venv/bin/python bench/int8_options.py [--calibration 16] [--rounds 40] [--out FILE.json]

Variants: the quantization recipes onnxruntime's docs offer for x86 (QDQ/QOperator, U8S8/U8U8,
reduce_range for CPUs without VNNI, only Conv/Gemm/MatMul quantized) and session settings
(graph optimization 'extended' instead of 'all', which leaves out the NHWC layout transformer;
`session.enable_quant_qdq_cleanup`; `session.disable_prepacking`; `session.x64quantprecision`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import optimize_inputs as inputs
from onnxruntime.quantization import (
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quant_pre_process,
    quantize_static,
)
from optimize import SampleReader

from mcpd.demo.build import resnet50
from mcpd.optimize.interface import interface
from mcpd.optimize.measure import compare, outputs, session, side_by_side_ms

RECIPES: dict[str, dict[str, Any]] = {
    "QDQ U8S8 per-channel": {},
    "QOperator U8S8 per-channel": {"quant_format": QuantFormat.QOperator},
    "QDQ U8U8 per-channel": {"weight_type": QuantType.QUInt8},
    "QDQ U8S8 per-channel reduce_range": {"reduce_range": True},
    "QDQ U8S8 per-channel Conv/Gemm/MatMul only": {
        "op_types_to_quantize": ["Conv", "Gemm", "MatMul"]
    },
}
# Session settings, applied to the first recipe's model.
SETTINGS: dict[str, dict[str, Any]] = {
    "graph optimization 'extended' (no NHWC transformer)": {
        "level": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    },
    "session.enable_quant_qdq_cleanup=1": {"config": {"session.enable_quant_qdq_cleanup": "1"}},
    "session.disable_prepacking=1": {"config": {"session.disable_prepacking": "1"}},
    # U8U8 kernels instead of U8S8, which can saturate on AVX2 without VNNI: a price, not a gain.
    "session.x64quantprecision=1": {"config": {"session.x64quantprecision": "1"}},
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calibration", type=int, default=16, help="samples (default 16)")
    parser.add_argument("--rounds", type=int, default=40, help="timing rounds (default 40)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mcpd-int8-") as folder:
        scratch = Path(folder)
        model = scratch / "resnet50.onnx"
        onnx.save(resnet50(), model)
        name = interface(onnx.load(str(model))).inputs[0].name
        calibration = inputs.pages(args.calibration, 1)
        held_out = [{name: s[np.newaxis]} for s in inputs.pages(8, 2)]
        pre = scratch / "pre.onnx"
        quant_pre_process(str(model), str(pre))
        paths = {"FP32 (original)": model}
        for label, recipe in RECIPES.items():
            started = time.monotonic()
            path = scratch / f"{len(paths)}.onnx"
            with contextlib.redirect_stdout(io.StringIO()):
                quantize_static(
                    str(pre),
                    str(path),
                    SampleReader(name, calibration),
                    **{
                        "quant_format": QuantFormat.QDQ,
                        "activation_type": QuantType.QUInt8,
                        "weight_type": QuantType.QInt8,
                        "per_channel": True,
                        "calibrate_method": CalibrationMethod.MinMax,
                        "calibration_cache_path": str(scratch / "ranges.json"),
                        **recipe,
                    },
                )
            paths[label] = path
            print(f"  {label}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        reference = outputs(model, held_out)
        specs = interface(onnx.load(str(model))).outputs
        rows = [{"variant": label, "path": path} for label, path in paths.items()]
        rows += [
            {"variant": f"QDQ U8S8 per-channel, {label}", "path": paths["QDQ U8S8 per-channel"]}
            | setting
            for label, setting in SETTINGS.items()
        ]
        runners = [session(r["path"], 0, r.get("config"), r.get("level")) for r in rows]
        for row, runner in zip(rows, runners, strict=True):
            got = [list(runner.run(None, sample)) for sample in held_out]
            row["cosine_min"] = compare(reference, got, specs).cosine_min
        print(f"  timing {len(rows)} side by side", file=sys.stderr, flush=True)
        timed = side_by_side_ms(
            [partial(r.run, None) for r in runners], held_out[0], args.rounds, budget_s=600.0
        )
    lines = ["| variant | ms | speedup | cosine min |", "|---|---:|---:|---:|"]
    for row, ms in zip(rows, timed, strict=True):
        row.update(latency_ms=ms, speedup=timed[0] / ms)
        row.pop("path")
        row.pop("level", None)
        lines.append(
            f"| {row['variant']} | {ms:.2f} | {row['speedup']:.2f}× | {row['cosine_min']:.4f} |"
        )
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
