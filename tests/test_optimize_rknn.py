"""`mcpd optimize --target rk3588` through a real rknn-toolkit2 (its simulator), opt-in: the toolkit
pins old numpy/onnx/torch and takes minutes to install, so it is not part of tests/run. Run with

    python3 -m venv /tmp/rknn-venv && /tmp/rknn-venv/bin/pip install rknn-toolkit2
    MCPD_RKNN_PYTHON=/tmp/rknn-venv/bin/python .venv/bin/python -m pytest tests/test_optimize_rknn.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mcpd.cli import main
from tests import optimize_models as models

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
