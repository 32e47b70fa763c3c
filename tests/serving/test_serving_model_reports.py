"""Triton's model configuration for an RKNN model (the fake rknnlite that enforces the documented
contract; the RKNN backend is untested on hardware): what it serves as, with its fixed batch."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from mcpd.serving import backends
from mcpd.serving.model_reports import config_datatype, model_config
from tests.support.fake_rknn import model


def test_an_rknn_model_is_described_as_its_runtime_serves_it(
    lite: ModuleType, tmp_path: Path
) -> None:
    section = model(tmp_path, [2, 8, 8, 3])
    backend = backends.load(section)
    try:
        described = model_config(section, backend)
    finally:
        backend.close()
    assert (described["platform"], described["backend"]) == ("rknn_rknn", "rknn")
    assert described["max_batch_size"] == section.max_batch  # served for any batch (padded)
    assert described["input"] == [
        {"name": "images", "data_type": "TYPE_UINT8", "dims": [8, 8, 3], "format": "FORMAT_NONE",
         "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False},
    ]  # fmt: skip
    assert described["instance_group"] == [{"name": "npu", "kind": "KIND_MODEL", "count": 1}]


def test_bytes_is_type_string_in_a_model_configuration() -> None:
    assert config_datatype("BYTES") == "TYPE_STRING"
    assert config_datatype("FP16") == "TYPE_FP16"
