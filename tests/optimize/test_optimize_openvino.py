"""`mcpd optimize`'s OpenVINO candidates on real OpenVINO and NNCF, on models the tests build: the
candidates per CPU, both runtimes side by side with `--json` naming each, the IR pair written
with its precision stored in it, the gate applied to NNCF's INT8, and the accuracy-aware INT8
built only when plain INT8 misses the gate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import openvino
import pytest

from mcpd.cli import main
from mcpd.config import OpenVinoOptions
from mcpd.optimize import plan
from mcpd.optimize.interface import openvino_interface
from mcpd.serving.backends.openvino import open_compiled, precision_in_force, stored_precision
from tests.support import optimize_models as models

CAPABILITIES = [str(c) for c in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]


def optimize(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code = main(["optimize", *args, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)  # NNCF's progress and messages stay off stdout


@pytest.fixture
def cnn(tmp_path: Path) -> list[str]:
    model = models.cnn(tmp_path / "cnn.onnx")
    calibration = models.npy_folder(tmp_path / "calibration", models.cnn_samples(16))
    return [str(model), "--calibration", str(calibration), "--out", str(tmp_path / "out")]


@pytest.fixture
def outlier(tmp_path: Path) -> list[str]:
    """The model INT8 cannot represent (one activation 10⁴× the others)."""
    model = models.outlier(tmp_path / "outlier.onnx")
    rng = np.random.default_rng(0)
    samples = [rng.normal(0, 1, 32).astype(np.float32) for _ in range(16)]
    calibration = models.npy_folder(tmp_path / "x", samples)
    return [str(model), "--calibration", str(calibration), "--out", str(tmp_path / "out")]


def test_cpu_target_measures_both_runtimes_side_by_side_and_names_each(
    cnn: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    doc = optimize(capsys, *cnn, "--precision", "fp32")
    by_runtime = {c["runtime"]: c for c in doc["candidates"] if c["name"] != "original (unchanged)"}
    assert by_runtime["onnxruntime"]["name"] == "fp32 graph-optimized"
    assert by_runtime["openvino"]["name"] == "openvino fp32"
    assert all(c["latency_ms"] and c["seconds"] is not None for c in by_runtime.values())
    (chosen,) = (c for c in doc["candidates"] if c["chosen"])
    assert doc["runtime"] == chosen["runtime"]
    assert (
        Path(doc["output"]).suffix == {"onnxruntime": ".onnx", "openvino": ".xml"}[doc["runtime"]]
    )


def test_openvino_target_writes_an_ir_pair_that_runs_at_its_measured_precision(
    cnn: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = optimize(capsys, *cnn, "--target", "openvino", "--min-top1", "0")
    floats = [c["precision"] for c in doc["candidates"] if c["precision"] in plan.FLOATS]
    # bf16 only where the CPU runs it natively (AMX or AVX512-BF16).
    assert floats == ["fp32", *(["bf16"] if "BF16" in CAPABILITIES else [])]
    assert {c["runtime"] for c in doc["candidates"]} == {"openvino"}
    written = Path(doc["output"])
    assert doc["runtime"] == "openvino" and written.name == f"cnn.{doc['precision']}.xml"
    assert sorted(p.name for p in written.parent.iterdir()) == [
        written.with_suffix(".bin").name,
        written.name,
    ]
    original = tmp_path / "cnn.onnx"
    assert openvino_interface(written) == openvino_interface(original)
    compiled = open_compiled(written, OpenVinoOptions())
    hint = stored_precision(openvino.Core().read_model(str(written)))
    # Served with precision "auto", the IR runs at what it was measured at (INT8: its floats').
    assert precision_in_force(compiled) == hint
    if doc["precision"] in plan.FLOATS:
        assert hint == plan.HINTS[doc["precision"]]
    image = models.cnn_samples(1)[0][np.newaxis]
    assert np.argmax(compiled.create_infer_request().infer([image])[0]) == np.argmax(
        open_compiled(original, OpenVinoOptions(precision="f32"))([image])[0]
    )


def test_nncf_int8_is_gated_and_accuracy_aware_int8_only_follows_a_miss(
    cnn: list[str], outlier: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    asked = ["--target", "openvino", "--precision", "int8", "--min-top1", "0"]
    doc = optimize(capsys, *outlier, *asked)
    plain, aware = doc["candidates"][0], doc["candidates"][1]
    assert plain["name"] == "openvino int8 nncf fp32" and not plain["accepted"]
    assert plain["cosine_min"] < 0.5  # the loud channel takes every 8-bit step
    assert aware["name"] == "openvino int8 nncf accuracy-aware fp32"
    for c in doc["candidates"]:  # the same gate on the same held-out samples
        assert c["accepted"] == (c["cosine_min"] >= 0.98)
    (chosen,) = (c for c in doc["candidates"] if c["chosen"])
    assert chosen["accepted"] and chosen["name"] != plain["name"]

    # INT8 that meets the gate (the CNN's is at cosine 0.97 here): nothing more is built.
    doc = optimize(capsys, *cnn, *asked, "--min-cosine", "0.9")
    assert [c["name"] for c in doc["candidates"]] == ["openvino int8 nncf fp32"]
    assert doc["candidates"][0]["accepted"] and doc["precision"] == "int8"
