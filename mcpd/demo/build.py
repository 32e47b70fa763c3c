"""Small ONNX models built with onnx.helper, with deterministic random weights: the bundled demo
model, and the models the tests and benchmarks serve. Needs the `onnx` package (a test extra).

    python -m mcpd.demo.build    # rewrite mcpd/demo/demo.onnx
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mcpd.demo import MODEL

OPSET = 17
IR_VERSION = 8  # readable by onnxruntime 1.16, the oldest we support


class Graph:
    """A growing single-path graph: each layer reads the previous output."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.weights: list[Any] = []
        self.count = 0

    def name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def weight(self, shape: Sequence[int], fan_in: int) -> str:
        name = self.name("w")
        values = self.rng.normal(0.0, np.sqrt(2.0 / fan_in), shape).astype(np.float32)
        self.weights.append(numpy_helper.from_array(values, name))
        return name

    def node(self, op: str, inputs: Sequence[str], **attrs: Any) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, relu: bool = True) -> str:
        w = self.weight((cout, cin, k, k), cin * k * k)
        b = self.weight((cout,), cout)
        pad = k // 2
        y = self.node("Conv", [x, w, b], strides=[stride, stride], pads=[pad] * 4)
        return self.node("Relu", [y]) if relu else y

    def dense(self, x: str, cin: int, cout: int) -> str:
        return self.node("Gemm", [x, self.weight((cin, cout), cin), self.weight((cout,), cout)])

    def head(self, x: str, channels: int, classes: int) -> str:
        pooled = self.node("Flatten", [self.node("GlobalAveragePool", [x])])
        return self.dense(pooled, channels, classes)

    def model(
        self, inputs: Sequence[Any], outputs: Sequence[tuple[str, str, Sequence[Any]]]
    ) -> onnx.ModelProto:
        for name, source, _ in outputs:
            self.nodes.append(helper.make_node("Identity", [source], [name]))
        graph = helper.make_graph(
            self.nodes,
            "mcpd",
            list(inputs),
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, _, s in outputs],
            self.weights,
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="mcpd"
        )
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model


def image_input(name: str, batch: int | str, channels: int, size: int) -> Any:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, channels, size, size])


def classifier(
    size: int = 64, width: int = 48, classes: int = 10, batch: int | str = "N", seed: int = 0
) -> onnx.ModelProto:
    """conv-relu-pool ×2, global pool, dense, softmax: image [N,3,size,size] -> scores [N,classes]."""
    g = Graph(seed)
    x = g.node("MaxPool", [g.conv("image", 3, width, 3)], kernel_shape=[2, 2], strides=[2, 2])
    x = g.conv(x, width, width * 2, 3)
    scores = g.node("Softmax", [g.head(x, width * 2, classes)], axis=1)
    return g.model([image_input("image", batch, 3, size)], [("scores", scores, [batch, classes])])


def resnet50(size: int = 224, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """ResNet-50's shape (bottleneck stages of 3, 4, 6, 3 blocks; batch norm folded away):
    image [N,3,size,size] -> logits [N,classes], about 4 GFLOPs per image at 224."""
    g = Graph(seed)
    x = g.conv("image", 3, 64, 7, stride=2)
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (blocks, mid) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512))):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            y = g.conv(x, cin, mid, 1)
            y = g.conv(y, mid, mid, 3, stride=stride)
            y = g.conv(y, mid, mid * 4, 1, relu=False)
            shortcut = x if block else g.conv(x, cin, mid * 4, 1, stride=stride, relu=False)
            x = g.node("Relu", [g.node("Add", [y, shortcut])])
            cin = mid * 4
    logits = g.head(x, cin, classes)
    return g.model([image_input("image", "N", 3, size)], [("logits", logits, ["N", classes])])


def main() -> None:
    onnx.save(classifier(), MODEL)
    print(f"wrote {MODEL}")


if __name__ == "__main__":
    main()
