"""An RKNN model for the fake rknnlite (tests/serving_rknn, put in place by the `lite` fixture of
tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

from mcpd.config import ModelSection
from mcpd.schema import build


def model(tmp_path: Path, shape: list[int], **rknn: object) -> ModelSection:
    path = tmp_path / "m.rknn"
    path.write_bytes(b"RKNN" + json.dumps({"inputs": [shape]}).encode())
    inputs = [{"name": "images", "datatype": "UINT8", "shape": shape}]
    return build(
        ModelSection, {"name": "npu", "path": str(path), "rknn": {"inputs": inputs, **rknn}}
    )
