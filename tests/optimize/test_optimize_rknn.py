"""`mcpd optimize --target rk3588` through a real rknn-toolkit2 (its simulator), opt-in: the toolkit
pins old numpy/onnx/torch and takes minutes to install, so it is not part of tests/run. Run with

    python3 -m venv /tmp/rknn-venv && /tmp/rknn-venv/bin/pip install rknn-toolkit2
    MCPD_RKNN_PYTHON=/tmp/rknn-venv/bin/python .venv/bin/python -m pytest tests/optimize/test_optimize_rknn.py

(Run here with rknn-toolkit2 2.5.0 from PyPI: 2 passed in about a minute.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from mcpd.cli import main
from tests.support import optimize_models as models

pytestmark = pytest.mark.skipif(
    not os.environ.get("MCPD_RKNN_PYTHON"), reason="opt-in: set MCPD_RKNN_PYTHON (see docstring)"
)


def test_cnn_to_rknn_checked_in_the_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = models.cnn(tmp_path / "cnn.onnx")
    calibration = models.npy_folder(tmp_path / "cal", models.cnn_samples(16))
    out = tmp_path / "out"
    argv = [str(model), "--calibration", str(calibration), "--out", str(out), "--min-top1", "0"]
    assert main(["optimize", *argv, "--target", "rk3588", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["target"] == "rk3588" and doc["speedup"] is None
    assert doc["precision"] in ("int8", "fp16")
    assert doc["accuracy"]["cosine_min"] >= 0.98
    written = Path(doc["output"])
    assert written.suffix == ".rknn" and written.parent == out and written.stat().st_size > 0
    assert all(c["name"].startswith("rknn ") for c in doc["candidates"])


def test_layer_analysis_names_the_layer_int8_breaks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The outlier model's 10⁴-scaled activation leaves INT8 nothing for the last MatMul: both
    INT8 builds fail the gate, FP16 is written, and the toolkit's analysis of each INT8 build
    puts that MatMul first."""
    model = models.outlier(tmp_path / "outlier.onnx")
    (last_matmul,) = [
        n.output[0] for n in onnx.load(str(model)).graph.node if n.op_type == "MatMul"
    ][-1:]
    rng = np.random.default_rng(2)
    calibration = models.npy_folder(
        tmp_path / "cal", [rng.normal(size=32).astype(np.float32) for _ in range(16)]
    )
    out = tmp_path / "out"
    argv = [str(model), "--calibration", str(calibration), "--out", str(out), "--min-top1", "0"]
    assert main(["optimize", *argv, "--target", "rk3588", "--layer-analysis", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["precision"] == "fp16" and doc["layers"] is not None
    int8 = [c for c in doc["candidates"] if c["precision"] == "int8"]
    assert len(int8) == 2 and not any(c["accepted"] for c in int8)
    for candidate in int8:
        worst = candidate["layers"][0]
        assert worst["name"].startswith(last_matmul), candidate["layers"][:3]
        assert worst["note"] == "q_zero" or worst["single_cosine"] < 0.9
    assert all(layer["single_cosine"] > 0.999 for layer in doc["layers"])
