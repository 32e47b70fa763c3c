"""Building candidate models with onnxruntime's own tooling (docs/optimizer.md has the sources):
graph optimization (FP32), static INT8 QDQ (quantize_static), INT4 weight-only MatMulNBits, and
FP16. Each builder reads a model file and writes one; the interface is restored afterwards by the
caller."""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quant_pre_process,
    quantize_static,
)

from mcpd.optimize.samples import Sample

log = logging.getLogger(__name__)

METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "percentile": CalibrationMethod.Percentile,
    "entropy": CalibrationMethod.Entropy,
}
# Below this many weights a MatMul is not worth 4-bit blocks (and K must fill one block).
INT4_MIN_WEIGHTS = 4096
INT4_BLOCK = 32
# onnxruntime/tools/symbolic_shape_infer.py, SymbolicShapeInference.infer_shapes
SYMBOLIC_LEFTOVER = "sym_shape_infer_temp.onnx"


@dataclass(frozen=True)
class Int8Recipe:
    """One quantize_static configuration. `activations` u8 = U8S8, s8 = S8S8 (TensorRT's only
    format); `exclude` keeps those nodes in FP32 (mixed precision)."""

    method: str = "minmax"
    activations: str = "u8"
    operator_format: bool = False  # QOperator (QLinearConv, …) instead of QDQ: CPU only
    per_channel: bool = True
    symmetric: bool = False
    preprocessed: bool = True
    exclude: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        parts = [
            "int8",
            f"{self.activations}s8",
            self.method,
            "per-channel" if self.per_channel else "per-tensor",
        ]
        if self.symmetric:
            parts.append("symmetric")
        if self.operator_format:
            parts.append("qoperator")
        if not self.preprocessed:
            parts.append("no-preprocess")
        if self.exclude:
            parts.append(f"{len(self.exclude)} fp32 nodes")
        return " ".join(parts)


class _Reader(CalibrationDataReader):  # type: ignore[misc]
    def __init__(self, samples: list[Sample]) -> None:
        self._samples = iter(samples)

    def get_next(self) -> Sample | None:
        return next(self._samples, None)


def name_nodes(model: onnx.ModelProto) -> None:
    """Give every node a unique name: nodes_to_exclude and sensitivity refer to nodes by name."""
    seen: set[str] = set()
    for index, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
        seen.add(node.name)


def preprocess(source: Path, target: Path) -> Path:
    """quant_pre_process (symbolic shape inference + graph optimization), which onnxruntime says to
    run before quantizing; models symbolic inference cannot handle get plain ONNX inference. The
    result has every node named."""
    # On failure, symbolic shape inference saves its partial model in the working folder.
    strays = [Path(SYMBOLIC_LEFTOVER), Path(SYMBOLIC_LEFTOVER + ".data")]
    ours = [p for p in strays if not p.exists()]
    try:
        quant_pre_process(str(source), str(target))
    except Exception as exc:  # sympy/onnx shape inference fail on some exported graphs
        log.info("symbolic shape inference failed (%s); using ONNX shape inference", exc)
        for path in ours:
            path.unlink(missing_ok=True)
        quant_pre_process(str(source), str(target), skip_symbolic_shape=True)
    model = onnx.load(str(target))
    name_nodes(model)
    onnx.save(_at_least_opset_13(model), str(target))
    return target


def _at_least_opset_13(model: onnx.ModelProto) -> onnx.ModelProto:
    """Per-channel QDQ needs DequantizeLinear's `axis`, which exists from opset 13; older models
    (PaddlePaddle exports are often opset 11) are converted first, else the quantizer writes a
    graph onnxruntime rejects."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset >= 13:
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, 13)
    except Exception as exc:  # the converter lacks adapters for some ops
        log.info("opset %d -> 13 conversion failed (%s); keeping opset %d", opset, exc, opset)
        return model


def graph_optimized(source: Path, target: Path, level: str = "extended") -> Path:
    """onnxruntime's own graph optimization, saved. `extended` fusions are for the CPU provider;
    `basic` ones are provider-independent (for TensorRT/CUDA targets)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        if level == "extended"
        else ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    )
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return target


def int8(
    source: Path, target: Path, calibration: list[Sample], recipe: Int8Recipe, cache_dir: Path
) -> Path:
    """Static INT8 QDQ with `recipe`. Calibration ranges are cached per method and source in
    `cache_dir`, so variants of one calibration cost only the quantization pass."""
    cache = cache_dir / f"ranges-{recipe.method}-{'pre' if recipe.preprocessed else 'raw'}.json"
    extra = {
        "ActivationSymmetric": recipe.symmetric,
        "WeightSymmetric": True,
        "CalibMovingAverage": False,
    }
    # The calibrators print their progress to stdout, which belongs to --json.
    with contextlib.redirect_stdout(sys.stderr):
        quantize_static(
            str(source),
            str(target),
            _Reader(calibration),
            quant_format=QuantFormat.QOperator if recipe.operator_format else QuantFormat.QDQ,
            per_channel=recipe.per_channel,
            activation_type=QuantType.QUInt8 if recipe.activations == "u8" else QuantType.QInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=list(recipe.exclude),
            calibrate_method=METHODS[recipe.method],
            extra_options=extra,
            calibration_cache_path=str(cache),
        )
    return target


def int4_weights(model: onnx.ModelProto) -> int:
    """How many MatMul weights (constant right-hand side, K a multiple of the block) INT4 would
    cover; 0 means INT4 has nothing worth quantizing."""
    weights = {init.name: init for init in model.graph.initializer}
    total = 0
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in weights:
            continue
        dims = list(weights[node.input[1]].dims)
        if len(dims) == 2 and dims[0] % INT4_BLOCK == 0 and dims[0] * dims[1] >= INT4_MIN_WEIGHTS:
            total += dims[0] * dims[1]
    return total


def int4(source: Path, target: Path) -> Path:
    """Weight-only INT4 (MatMulNBits, blocks of 32, symmetric); accuracy_level 4 lets the CPU
    kernel compute in INT8, its fast path."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(source)), block_size=INT4_BLOCK, is_symmetric=True, accuracy_level=4
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(target))
    return target


def fp16(source: Path, target: Path) -> Path:
    """FP16 weights and compute with FP32 inputs and outputs (keep_io_types), for CUDA/TensorRT."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(source)), keep_io_types=True), str(target))
    return target
