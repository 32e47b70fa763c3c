"""Models and calibration folders for the optimizer tests, built here (onnx.helper, deterministic
weights): a small CNN, a transformer-style block with MatMul weights (INT4), and a model with one
layer that INT8 cannot represent (mixed precision)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mcpd.demo.build import IR_VERSION, OPSET, Graph, classifier


def cnn(path: Path) -> Path:
    """image FP32 [N,3,32,32] -> scores [N,10] (conv-relu-pool ×2, dense, softmax)."""
    onnx.save(classifier(size=32, width=16), path)
    return path


def _save(
    g: Graph,
    inputs: list[onnx.ValueInfoProto],
    outputs: list[tuple[str, str, list[object]]],
    path: Path,
) -> Path:
    onnx.save(g.model(inputs, outputs), path)
    return path


def transformer(path: Path, dim: int = 64, classes: int = 16) -> Path:
    """x FP32 [N,T,dim] -> logits [N,T,classes]: single-head self-attention and a feed-forward
    block with residuals, every projection a MatMul with constant weights."""
    g = Graph(seed=3)

    def project(x: str, cin: int, cout: int) -> str:
        return g.node("MatMul", [x, g.weight((cin, cout), cin)])

    q, k, v = (project("x", dim, dim) for _ in range(3))
    kt = g.node("Transpose", [k], perm=[0, 2, 1])
    scale = g.name("scale")
    g.weights.append(numpy_helper.from_array(np.array(dim**-0.5, np.float32), scale))
    attn = g.node("Softmax", [g.node("Mul", [g.node("MatMul", [q, kt]), scale])], axis=-1)
    h = g.node("Add", ["x", project(g.node("MatMul", [attn, v]), dim, dim)])
    ff = project(g.node("Relu", [project(h, dim, dim * 2)]), dim * 2, dim)
    logits = project(g.node("Add", [h, ff]), dim, classes)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", dim])
    return _save(g, [x], [("logits", logits, ["N", "T", classes])], path)


def outlier(path: Path, width: int = 32, classes: int = 8) -> Path:
    """x FP32 [N,width] -> scores [N,classes], where one channel of a hidden activation is scaled
    10⁴× and the next layer scales it back: 8-bit ranges for that activation (and the scaling
    constant) lose every other channel, so plain INT8 is inaccurate and only keeping those nodes
    in FP32 (mixed precision) recovers it."""
    g = Graph(seed=5)
    h = g.node("Relu", [g.dense("x", width, width)])
    h = g.dense(g.node("Relu", [g.dense(h, width, width)]), width, width)
    gain = np.ones(width, np.float32)
    gain[0] = 1e4
    name = g.name("gain")
    g.weights.append(numpy_helper.from_array(gain, name))
    loud = g.node("Mul", [h, name])
    w = g.rng.normal(0.0, np.sqrt(2.0 / width), (width, classes)).astype(np.float32)
    w[0] /= 1e4
    wname = g.name("w")
    g.weights.append(numpy_helper.from_array(w, wname))
    scores = g.node("MatMul", [loud, wname])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])
    return _save(g, [x], [("scores", scores, ["N", classes])], path)


def two_inputs(path: Path) -> Path:
    """a FP32 [N,4], b FP32 [N,4] -> y = a + b."""
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        "two",
        [info("a", TensorProto.FLOAT, ["N", 4]), info("b", TensorProto.FLOAT, ["N", 4])],
        [info("y", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.save(model, path)
    return path


def scenes(count: int, size: int, seed: int = 0) -> list[np.ndarray]:
    """Image-like HxWx3 uint8 arrays (smooth gradients, blobs and mild noise), so calibration sees
    the correlated statistics of pictures rather than white noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    images = []
    for _ in range(count):
        channels = []
        for _ in range(3):
            a, b, c = rng.uniform(-1, 1, 3)
            cy, cx, r = rng.uniform(0.2, 0.8, 3)
            blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (0.05 + 0.1 * r))
            channels.append(0.5 + 0.25 * (a * xx + b * yy) + c * 0.4 * blob)
        image = np.stack(channels, axis=-1) + rng.normal(0, 0.02, (size, size, 3))
        images.append((np.clip(image, 0, 1) * 255).astype(np.uint8))
    return images


def image_folder(folder: Path, count: int, size: int) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for index, pixels in enumerate(scenes(count, size)):
        Image.fromarray(pixels).save(folder / f"scene{index:02d}.png")
    return folder


def npy_folder(folder: Path, arrays: list[np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for index, array in enumerate(arrays):
        np.save(folder / f"sample{index:02d}.npy", array)
    return folder


def cnn_samples(count: int = 16) -> list[np.ndarray]:
    """The scenes as the CNN's input ([3,32,32], ImageNet normalisation), without batch axis."""
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    return [
        ((s.astype(np.float32) / 255 - mean) / std).transpose(2, 0, 1).copy()
        for s in scenes(count, 32)
    ]


def sequences(count: int, length: int = 12, dim: int = 64, seed: int = 1) -> list[np.ndarray]:
    """Token-embedding-like [1,T,dim] inputs: a smooth positional pattern plus per-token vectors."""
    rng = np.random.default_rng(seed)
    position = np.sin(np.arange(length)[:, None] / (1 + np.arange(dim)[None, :] / 4))
    vocab = rng.normal(0, 1, (50, dim))
    return [
        (vocab[rng.integers(0, 50, length)] + 0.5 * position)[None].astype(np.float32)
        for _ in range(count)
    ]
