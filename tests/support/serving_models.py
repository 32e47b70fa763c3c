"""Tiny ONNX models for the serving tests, built with onnx.helper (real onnxruntime sessions)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mcpd.demo.build import IR_VERSION, OPSET


def _save(nodes: list[onnx.NodeProto], inputs: list, outputs: list, path: Path) -> Path:
    graph = helper.make_graph(nodes, "test", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def scale(path: Path, batch: int | str = "N", width: int = 4) -> Path:
    """x FP32 [batch, width] -> double = 2x [batch, width], total = sum(x, axis 1) [batch]."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Constant", [], ["c2"], value=two),
        helper.make_node("Constant", [], ["ax"], value=axes),
        helper.make_node("Mul", ["x", "c2"], ["double"]),
        helper.make_node("ReduceSum", ["x", "ax"], ["total"], keepdims=0),
    ]
    return _save(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [
            helper.make_tensor_value_info("double", TensorProto.FLOAT, [batch, width]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, [batch]),
        ],
        path,
    )


def spread(path: Path, width: int) -> Path:
    """A small request, a large answer: x FP32 [N, 1] -> wide = x repeated [N, width]."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, width])
    nodes = [
        helper.make_node("Constant", [], ["s"], value=shape),
        helper.make_node("Expand", ["x", "s"], ["wide"]),
    ]
    info = helper.make_tensor_value_info
    return _save(
        nodes,
        [info("x", TensorProto.FLOAT, ["N", 1])],
        [info("wide", TensorProto.FLOAT, ["N", width])],
        path,
    )


def mixed(path: Path) -> Path:
    """Three datatypes: a INT64 [N,2] -> a3 = 3a; b UINT8 [N,2] -> b_out = b; flag BOOL [N,1] ->
    flag_not = not flag."""
    three = helper.make_tensor("three", TensorProto.INT64, [], [3])
    nodes = [
        helper.make_node("Constant", [], ["c3"], value=three),
        helper.make_node("Mul", ["a", "c3"], ["a3"]),
        helper.make_node("Identity", ["b"], ["b_out"]),
        helper.make_node("Not", ["flag"], ["flag_not"]),
    ]
    info = helper.make_tensor_value_info
    return _save(
        nodes,
        [
            info("a", TensorProto.INT64, ["N", 2]),
            info("b", TensorProto.UINT8, ["N", 2]),
            info("flag", TensorProto.BOOL, ["N", 1]),
        ],
        [
            info("a3", TensorProto.INT64, ["N", 2]),
            info("b_out", TensorProto.UINT8, ["N", 2]),
            info("flag_not", TensorProto.BOOL, ["N", 1]),
        ],
        path,
    )


def sequence(path: Path) -> Path:
    """A free non-batch dimension: x FP32 [N, L] -> y = 2x."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    nodes = [
        helper.make_node("Constant", [], ["c2"], value=two),
        helper.make_node("Mul", ["x", "c2"], ["y"]),
    ]
    info = helper.make_tensor_value_info
    return _save(
        nodes,
        [info("x", TensorProto.FLOAT, ["N", "L"])],
        [info("y", TensorProto.FLOAT, ["N", "L"])],
        path,
    )


def strings(path: Path, batch: int | str = "N") -> Path:
    """String tensors both ways: text STRING [batch, 2] -> echo = text, code INT64 [batch, 2] = 1
    for "yes", 0 for "no", -1 otherwise (ai.onnx.ml LabelEncoder)."""
    nodes = [
        helper.make_node("Identity", ["text"], ["echo"]),
        helper.make_node(
            "LabelEncoder",
            ["text"],
            ["code"],
            domain="ai.onnx.ml",
            keys_strings=["yes", "no"],
            values_int64s=[1, 0],
            default_int64=-1,
        ),
    ]
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "strings",
        [info("text", TensorProto.STRING, [batch, 2])],
        [info("echo", TensorProto.STRING, [batch, 2]), info("code", TensorProto.INT64, [batch, 2])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.onnx.ml", 2)],
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def heavy(path: Path, layers: int = 40, width: int = 512) -> Path:
    """x FP32 [N, width] -> y: `layers` matrix products by random weights, a 1 MB tensor each at
    the default width (42 MB in all): a model whose sessions show in the process's memory, made of
    tensors that glibc's heap keeps when they are freed, as a real network's are."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.random((width, width), dtype=np.float32), f"w{layer}")
        for layer in range(layers)
    ]
    nodes, previous = [], "x"
    for layer in range(layers):
        nodes.append(helper.make_node("MatMul", [previous, f"w{layer}"], [f"h{layer}"]))
        previous = f"h{layer}"
    nodes.append(helper.make_node("Identity", [previous], ["y"]))
    graph = helper.make_graph(
        nodes,
        "heavy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.save(model, path)
    return path


def ir(source: Path, precision: str | None = None) -> Path:
    """The ONNX model `source` as OpenVINO IR beside it (<stem>.xml and <stem>.bin), its weights
    kept in FP32 (save_model compresses them to FP16 by default); with `precision`, stored in the
    IR as mcpd's optimizer stores it."""
    import openvino

    from mcpd.serving.backends.openvino import store_precision

    model = openvino.convert_model(str(source))
    if precision is not None:
        store_precision(model, precision)
    target = source.with_suffix(".xml")
    openvino.save_model(model, str(target), compress_to_fp16=False)
    return target
