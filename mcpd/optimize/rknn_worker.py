"""Runs inside rknn-toolkit2's own virtual environment (never mcpd's: the toolkit pins old numpy,
onnx and torch), started by mcpd.optimize.rockchip with a job file. Standalone on purpose: it imports
only the toolkit and numpy.

    TOOLKIT_PYTHON rknn_worker.py JOB.json

Every toolkit call reports failure by a non-zero return code (inference by None); each is
checked and the first failure ends the job with one line on stderr and exit status 1 (3 for the
accuracy analysis). The API is rknn-toolkit2's (airockchip/rknn-toolkit2, doc/ user guide):
config, load_onnx, build, export_rknn, init_runtime() with no target = the simulator, inference,
and accuracy_analysis(inputs=one path per model input, output_dir=...), which with no target
also runs in the simulator (docs/optimizer.md).
"""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
from rknn.api import RKNN

ANALYSIS_FAILED = 3  # mcpd.optimize.rockchip reads this exit status


def _check(ret: object, step: str) -> None:
    if ret != 0:
        print(f"rknn-toolkit2 {step} failed (return code {ret})", file=sys.stderr)
        sys.exit(1)


def main(job_path: str) -> None:
    with open(job_path, encoding="utf-8") as file:
        job = json.load(file)
    rknn = RKNN(verbose=False)
    quantize = job["quantized_algorithm"] is not None
    config = {"target_platform": job["target"]}
    if quantize:
        config.update(
            quantized_dtype="w8a8",
            quantized_algorithm=job["quantized_algorithm"],
            quantized_method="channel",
        )
    _check(rknn.config(**config), "config")
    _check(
        rknn.load_onnx(
            model=job["model"], inputs=job["input_names"], input_size_list=job["input_shapes"]
        ),
        "load_onnx",
    )
    _check(rknn.build(do_quantization=quantize, dataset=job["dataset"]), "build")
    _check(rknn.export_rknn(job["output"]), "export_rknn")
    _check(rknn.init_runtime(), "init_runtime (simulator)")
    for index, paths in enumerate(job["validation"]):
        arrays = [np.load(path) for path in paths]
        formats = [
            "nchw" if a.ndim == 4 else "nhwc" for a in arrays
        ]  # 4-D inputs as ONNX lays them
        outputs = rknn.inference(inputs=arrays, data_format=formats)
        if outputs is None:
            print(f"rknn-toolkit2 inference failed on sample {index}", file=sys.stderr)
            sys.exit(1)
        np.savez(f"{job['results']}/{index}.npz", *outputs)
    # Per-layer analysis (asked for): one output folder per sample, each with the toolkit's
    # error_analysis.txt. Its failure is its own exit status, so that mcpd reports it as such
    # instead of skipping a build that worked.
    analysis = job.get("analysis")
    for index, paths in enumerate(analysis["samples"] if analysis else []):
        folder = f"{analysis['folder']}/{index}"
        ret = rknn.accuracy_analysis(inputs=paths, output_dir=folder)
        if ret != 0:
            print(f"rknn-toolkit2 accuracy_analysis failed (return code {ret})", file=sys.stderr)
            sys.exit(ANALYSIS_FAILED)
        # Every layer's float and simulated output, as text: gigabytes for a large model, and
        # only error_analysis.txt is read.
        for snapshots in ("golden", "simulator"):
            shutil.rmtree(f"{folder}/{snapshots}", ignore_errors=True)
    rknn.release()


if __name__ == "__main__":
    main(sys.argv[1])
