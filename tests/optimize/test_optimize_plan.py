"""What `mcpd optimize` decides before it builds anything (mcpd/optimize/plan.py), driven directly:
the runtimes per machine, OpenVINO's candidates per device and capabilities, the precision an INT8
model's float operations run at, when a step cannot win, the attention rule for NNCF's model
type, and the gate as accuracy-aware quantization's metric."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from mcpd.demo.build import IR_VERSION, OPSET
from mcpd.optimize import plan
from mcpd.optimize.measure import Accuracy
from tests.support import optimize_models as models

AMX = ["BF16", "FP32", "FP16", "INT8", "BIN", "EXPORT_IMPORT"]  # what OpenVINO says here
AVX2 = ["FP32", "INT8", "BIN", "EXPORT_IMPORT"]  # a CPU without AMX or AVX512-BF16


def test_cpu_target_measures_openvino_beside_onnxruntime_where_installed_on_x86() -> None:
    assert plan.default_runtimes(True, "x86_64") == ("onnxruntime", "openvino")
    assert plan.default_runtimes(True, "AMD64") == ("onnxruntime", "openvino")
    assert plan.default_runtimes(False, "x86_64") == ("onnxruntime",)
    # OpenVINO runs on Arm too, but is measured there only when asked for (--runtime).
    assert plan.default_runtimes(True, "aarch64") == ("onnxruntime",)


def test_openvino_candidates_per_device_and_what_it_runs_natively() -> None:
    # Floats first (a compile each), INT8 last (calibration); bf16 only where the CPU runs it.
    assert plan.openvino_candidates("CPU", AMX, "auto") == ("fp32", "bf16", "int8")
    assert plan.openvino_candidates("CPU", AVX2, "auto") == ("fp32", "int8")
    assert plan.openvino_candidates("GPU", [], "auto") == ("fp32", "fp16", "int8")
    assert plan.openvino_candidates("GPU.1", [], "auto") == ("fp32", "fp16", "int8")
    assert plan.openvino_candidates("NPU", [], "auto") == ("fp16", "int8")
    # An asked-for precision is the only one built, where the device has it.
    assert plan.openvino_candidates("CPU", AMX, "bf16") == ("bf16",)
    assert plan.openvino_candidates("CPU", AVX2, "bf16") == ()
    assert plan.openvino_candidates("CPU", AMX, "fp16") == ()  # f16 is for GPUs and NPUs
    assert plan.openvino_candidates("CPU", AMX, "int4") == ()  # onnxruntime's MatMulNBits only
    assert plan.openvino_candidates("NPU", [], "int8") == ("int8",)


def test_int8_float_operations_run_at_the_lowest_float_precision_that_met_the_gate() -> None:
    assert plan.int8_float_precision("CPU", ["fp32", "bf16"]) == "bf16"
    assert plan.int8_float_precision("CPU", ["fp32"]) == "fp32"  # bf16 missed the gate
    assert plan.int8_float_precision("GPU", ["fp32", "fp16"]) == "fp16"
    assert plan.int8_float_precision("CPU", []) == "fp32"  # none built: --precision int8
    assert plan.int8_float_precision("NPU", []) == "fp16"


def test_a_step_is_worth_taking_only_while_it_can_beat_what_is_accepted() -> None:
    assert plan.could_win(4.0, 5.0)
    assert not plan.could_win(5.0, 5.0)  # as fast is not faster
    assert not plan.could_win(6.0, 5.0)
    assert plan.could_win(None, 5.0) and plan.could_win(6.0, None)  # unknown: it may


def _attention_free_classifier() -> onnx.ModelProto:
    """x [N,8] -> Softmax(x·W): a MatMul by weights and a Softmax, but no attention."""
    info = helper.make_tensor_value_info
    weights = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], [0.1] * 32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["scores"], axis=-1),
        ],
        "classifier",
        [info("x", TensorProto.FLOAT, ["N", 8])],
        [info("scores", TensorProto.FLOAT, ["N", 4])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def test_attention_is_a_softmax_feeding_a_matmul_of_two_activations(tmp_path: Path) -> None:
    assert plan.has_attention(onnx.load(models.transformer(tmp_path / "t.onnx")))
    assert not plan.has_attention(onnx.load(models.cnn(tmp_path / "c.onnx")))
    assert not plan.has_attention(onnx.load(models.outlier(tmp_path / "o.onnx")))
    assert not plan.has_attention(_attention_free_classifier())


@pytest.mark.parametrize(
    ("cosine", "top1", "meets"),
    [(0.99, 0.98, True), (0.98, 0.97, True), (0.979, 1.0, False), (1.0, 0.96, False)],
)
def test_the_gate_as_a_metric_drops_past_its_bound_exactly_when_the_gate_fails(
    cosine: float, top1: float, meets: bool
) -> None:
    exact = plan.gate_score(Accuracy({"y": 1.0}, 0.0, 1.0), 0.98, 0.97)
    assert exact == pytest.approx(0.02)  # the original's, NNCF's max_drop
    score = plan.gate_score(Accuracy({"y": cosine}, 0.1, top1), 0.98, 0.97)
    assert Accuracy({"y": cosine}, 0.1, top1).meets(0.98, 0.97) == meets
    assert (exact - score <= exact) == meets
    # Without classification-shaped outputs the cosine alone decides.
    assert plan.gate_score(Accuracy({"y": 0.995}, 0.1, None), 0.98, 0.97) == pytest.approx(0.015)


def test_accuracy_aware_int8_is_budgeted_by_its_compiles_and_passes() -> None:
    # PP-OCRv4's recognizer here: 65 quantizers, 16 iterations, 0.77 s per compile, 36 samples
    # at 9 ms; it took 177 s.
    assert plan.accuracy_aware_seconds(65, 16, 0.77, 36, 0.009) == pytest.approx(177.2, abs=0.5)
    assert plan.accuracy_aware_seconds(0, 0, 1.0, 10, 0.1) == 0.0
