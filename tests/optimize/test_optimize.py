"""`mcpd optimize` end to end: real onnxruntime sessions and quantizer on models the tests build,
calibration folders of real files (.npy, .npz, PNG images), the JSON contract, and that what is
written loads in onnxruntime with the original's interface."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from mcpd.cli import main
from tests.support import optimize_models as models


def optimize(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = main(["optimize", *args, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else {}), err


def interface(path: Path) -> list[tuple[str, str, list[object]]]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [(v.name, v.type, v.shape) for v in [*session.get_inputs(), *session.get_outputs()]]


@pytest.fixture
def cnn(tmp_path: Path) -> tuple[Path, Path]:
    return models.cnn(tmp_path / "cnn.onnx"), models.npy_folder(
        tmp_path / "calibration", models.cnn_samples(16)
    )


def test_cnn_json_contract_and_written_model(
    cnn: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, calibration = cnn
    out = tmp_path / "out"
    code, doc, err = optimize(
        capsys,
        str(model),
        "--calibration",
        str(calibration),
        "--out",
        str(out),
        "--runtime",
        "onnxruntime",
    )
    assert code == 0, err
    assert set(doc) >= {
        "model",
        "output",
        "target",
        "precision",
        "speedup",
        "latency_ms",
        "accuracy",
        "candidates",
    }
    assert doc["target"] == "cpu" and doc["model"] == str(model)
    assert set(doc["latency_ms"]) == {"reference", "optimized"}
    assert set(doc["accuracy"]) == {"cosine_min", "max_abs", "top1_agreement"}
    assert doc["speedup"] == pytest.approx(
        doc["latency_ms"]["reference"] / doc["latency_ms"]["optimized"], rel=0.01
    )
    names = [c["name"] for c in doc["candidates"]]
    # A variant that cannot beat what is accepted already is skipped, with its speed and why.
    skipped = {s["name"]: s for s in doc["skipped"]}
    assert "fp32 graph-optimized" in names
    assert any(n.startswith("int8 u8s8") for n in [*names, *skipped])
    for s in skipped.values():
        assert s["reason"] and s["speedup"] > 0
    for c in doc["candidates"]:
        assert {"precision", "speedup", "cosine_min", "accepted", "seconds"} <= set(c)
        assert c["runtime"] == "onnxruntime"
    chosen = [c for c in doc["candidates"] if c["chosen"]]
    assert len(chosen) == 1 and chosen[0]["accepted"] and chosen[0]["precision"] == doc["precision"]
    # The fastest accepted candidate that also beats the original (FP32 otherwise).
    accepted = [c for c in doc["candidates"] if c["accepted"]]
    reference = doc["latency_ms"]["reference"]
    assert chosen[0]["latency_ms"] == min(
        c["latency_ms"]
        for c in accepted
        if c["precision"] == "fp32" or c["latency_ms"] <= reference  # (both rounded)
    )
    assert chosen[0]["latency_ms"] <= reference
    assert doc["accuracy"]["cosine_min"] >= 0.98 and doc["accuracy"]["top1_agreement"] >= 0.97
    written = Path(doc["output"])
    assert written.parent == out and sorted(p.name for p in out.iterdir()) == [written.name]
    assert written.stat().st_mode & 0o777 == 0o644
    assert interface(written) == interface(model)
    assert interface(model)[0] == ("image", "tensor(float)", ["N", 3, 32, 32])


def test_int8_candidate_is_a_qdq_model_within_the_gate(
    cnn: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, calibration = cnn
    code, doc, _ = optimize(
        capsys,
        str(model),
        "--calibration",
        str(calibration),
        "--out",
        str(tmp_path / "o"),
        "--precision",
        "int8",
        "--min-cosine",
        "0.99",
        "--runtime",
        "onnxruntime",
    )
    assert code == 0
    int8 = [c for c in doc["candidates"] if c["precision"] == "int8"]
    assert int8
    for c in doc["candidates"]:
        within = c["cosine_min"] >= 0.99 and (c["top1_agreement"] or 1.0) >= 0.97
        assert c["accepted"] == within, c
    if doc["precision"] == "int8":  # chosen only where it was measured faster than the original
        ops = {n.op_type for n in onnx.load(doc["output"]).graph.node}
        assert {"QuantizeLinear", "DequantizeLinear"} <= ops
        assert doc["latency_ms"]["optimized"] <= doc["latency_ms"]["reference"]


def test_images_with_preprocess_flag_and_sidecar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = models.cnn(tmp_path / "cnn.onnx")
    images = models.image_folder(tmp_path / "images", 8, 48)
    spec = "size=32 order=rgb mean=0.485,0.456,0.406 std=0.229,0.224,0.225 layout=nchw"
    args = [str(model), "--calibration", str(images), "--precision", "fp32"]
    args += ["--runtime", "onnxruntime"]
    code, doc, err = optimize(capsys, *args, "--out", str(tmp_path / "a"), "--preprocess", spec)
    assert code == 0, err
    (images / "preprocess.toml").write_text(
        'size = [32, 32]\norder = "rgb"\nmean = [0.485, 0.456, 0.406]\nstd = [0.229, 0.224, 0.225]\n'
    )
    code, doc, err = optimize(capsys, *args, "--out", str(tmp_path / "b"))
    assert code == 0, err
    assert interface(Path(doc["output"])) == interface(model)


def test_int4_on_a_transformer_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = models.transformer(tmp_path / "block.onnx")
    calibration = models.npy_folder(tmp_path / "seq", models.sequences(8))
    code, doc, err = optimize(
        capsys,
        str(model),
        "--calibration",
        str(calibration),
        "--out",
        str(tmp_path / "o"),
        "--precision",
        "int4",
        "--min-cosine",
        "0.9",
        "--min-top1",
        "0.5",
    )
    assert code == 0, err
    int4 = next(c for c in doc["candidates"] if c["precision"] == "int4")
    assert 0.9 < int4["cosine_min"] < 1.0  # 4-bit weights change the answer a little, not much
    if doc["precision"] == "int4":
        assert "MatMulNBits" in {n.op_type for n in onnx.load(doc["output"]).graph.node}
    assert interface(Path(doc["output"])) == interface(model)
    assert interface(model)[0] == ("x", "tensor(float)", ["N", "T", 64])


def test_mixed_precision_keeps_the_sensitive_layers_in_fp32(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = models.outlier(tmp_path / "outlier.onnx")
    rng = np.random.default_rng(0)
    calibration = models.npy_folder(
        tmp_path / "x", [rng.normal(0, 1, 32).astype(np.float32) for _ in range(16)]
    )
    code, doc, err = optimize(
        capsys,
        str(model),
        "--calibration",
        str(calibration),
        "--out",
        str(tmp_path / "o"),
        "--precision",
        "int8",
        "--runtime",
        "onnxruntime",
    )
    assert code == 0, err
    plain = [c for c in doc["candidates"] if c["precision"] == "int8" and not c["fp32_nodes"]]
    mixed = [c for c in doc["candidates"] if c["fp32_nodes"]]
    assert plain and not any(c["accepted"] for c in plain)
    assert mixed and mixed[-1]["accepted"] and mixed[-1]["cosine_min"] >= 0.98
    graph = onnx.load(str(model)).graph
    assert doc["sensitivity"][0]["op_type"] == "MatMul"
    assert graph.node[-2].op_type == "MatMul"  # the layer reading the 10⁴× channel


def test_tensorrt_target_gives_symmetric_s8_qdq_and_fp16(
    cnn: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, calibration = cnn
    code, doc, err = optimize(
        capsys,
        str(model),
        "--calibration",
        str(calibration),
        "--out",
        str(tmp_path / "o"),
        "--target",
        "tensorrt",
        "--min-top1",
        "0",
    )
    assert code == 0, err
    assert doc["speedup"] is None and doc["latency_ms"] == {"reference": None, "optimized": None}
    by_precision = {c["precision"]: c for c in doc["candidates"]}
    assert by_precision["fp16"]["cosine_min"] > 0.999  # FP16 accuracy, measured on this CPU
    assert doc["precision"] == "int8"  # accurate, and preferred on a GPU over FP16
    written = onnx.load(doc["output"])
    zero_points = {
        init.name: onnx.numpy_helper.to_array(init)
        for init in written.graph.initializer
        if init.name.endswith("zero_point")
    }
    assert zero_points
    # Signed and symmetric throughout (INT32 zero points are the biases').
    assert all(z.dtype in (np.int8, np.int32) and not z.any() for z in zero_points.values())
    assert any(z.dtype == np.int8 for z in zero_points.values())
    onnx.checker.check_model(written)
    assert interface(Path(doc["output"])) == interface(model)
