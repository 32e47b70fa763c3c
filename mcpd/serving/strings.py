"""BYTES tensors as the server reads them (docs/serving-protocol.md §2.1): the elements of a
serialized tensor, or of JSON strings, as the `str` objects onnxruntime's string tensors take.

onnxruntime's Python API turns any other object into text with str(): `bytes` would arrive as
"b'...'" (§5.1). So elements are decoded here, deliberately, and bytes that are not UTF-8, which no
text can hold, are refused with the element named rather than altered.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mcpd.serving.errors import RequestError
from mcpd.serving.tensors import deserialize_bytes


def from_binary(raw: bytes | bytearray | memoryview, count: int, what: str) -> np.ndarray:
    """The `count` elements of a serialized BYTES tensor (the request body's or a region's)."""
    try:
        elements = deserialize_bytes(raw, count)
    except ValueError as exc:
        raise RequestError(f"{what}: BYTES data: {exc}") from None
    flat = np.empty(count, object)
    for index, element in enumerate(elements):
        try:
            flat[index] = element.decode()
        except UnicodeDecodeError as exc:
            raise RequestError(
                f"{what}: element {index} is not UTF-8 ({exc.reason} at byte {exc.start}); "
                "string tensors hold text"
            ) from None
    return flat


def from_json(data: object, count: int, what: str) -> np.ndarray:
    """JSON BYTES data: strings, in a nested or flat list."""
    if not isinstance(data, list):
        raise RequestError(f"{what}: data must be a (nested or flat) JSON list")
    items: list[Any] = data
    while items and all(isinstance(item, list) for item in items):
        items = [element for inner in items for element in inner]
    if not all(isinstance(item, str) for item in items):
        raise RequestError(f"{what}: BYTES data in JSON must be strings")
    if len(items) != count:
        raise RequestError(f"{what}: {len(items)} values in data, the shape needs {count}")
    flat = np.empty(count, object)
    flat[:] = items
    return flat
