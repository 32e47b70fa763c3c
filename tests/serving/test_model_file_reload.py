"""A reload (SIGHUP) with an unchanged [[models]] table still reloads a model whose file changed."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mcpd.config import ModelSection
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config


def test_a_replaced_model_file_is_reloaded_and_an_unchanged_one_is_not(tmp_path: Path) -> None:
    path = scale(tmp_path / "m.onnx", width=4)
    model = {"name": "m", "path": str(path)}
    served = Served(config(tmp_path, [model]))
    try:
        served.wait_settled()
        section = ModelSection(name="m", path=str(path))
        served.reload([section])  # nothing changed: nothing reloads
        served.wait_settled()
        assert not [e for e in served.events if "reloaded" in e.message]
        scale(tmp_path / "new.onnx", width=6)
        os.replace(tmp_path / "new.onnx", path)  # replaced by rename, as deployments do
        served.reload([section])
        served.wait_settled()
        assert any(e.message.startswith("model m reloaded in") for e in served.events)
        with served.client() as client:
            assert client.model_metadata("m")["inputs"][0]["shape"] == [-1, 6]
            client.infer("m", {"x": np.zeros((1, 6), np.float32)})
    finally:
        served.close()
