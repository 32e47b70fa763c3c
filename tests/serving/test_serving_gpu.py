"""The GPU on Jetson: a Jetson whose onnxruntime has no CUDA or TensorRT provider (this machine's
onnxruntime has neither, like PyPI's aarch64 build) says so at start, and the provider each model
runs on is in the status. Untested on a GPU: no session here runs on one."""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path

import pytest

from mcpd import status
from mcpd.serving.backends.onnxrt import gpu_missing
from mcpd.status import StatusDocument
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config, status_document

CPU = "CPUExecutionProvider"


def test_only_a_jetson_without_a_gpu_provider_is_warned_about() -> None:
    warning = gpu_missing("jetson-orin", [CPU])
    assert warning is not None
    assert warning.startswith(
        "this jetson-orin board's onnxruntime has no CUDA or TensorRT provider (it has "
        "CPUExecutionProvider): models run on the CPU, not the GPU"
    )
    assert gpu_missing("jetson-nano", ["CUDAExecutionProvider", CPU]) is None
    assert gpu_missing("jetson-orin", ["TensorrtExecutionProvider", CPU]) is None
    assert gpu_missing("rk3588", [CPU]) is None
    assert gpu_missing("x86-intel", [CPU]) is None


@pytest.mark.parametrize(
    ("platform", "warned"),
    [("jetson-orin", True), ("jetson-nano", True), ("rk3588", False), ("x86-amd", False)],
)
def test_serving_warns_once_on_a_jetson_without_gpu_providers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, platform: str, warned: bool
) -> None:
    # The platform comes from the governor's status document, which may not be published yet
    # when serving starts: the check waits for it.
    calls = itertools.count()

    def document() -> StatusDocument | None:
        return None if next(calls) < 3 else {**status_document(), "platform": platform}

    model = {"name": "m", "path": str(scale(tmp_path / "m.onnx"))}
    with caplog.at_level(logging.WARNING, "mcpd.serving"):
        served = Served(config(tmp_path, [model]), status=document)
        try:
            served.wait_settled()
            check = served.service.gpu_check
            assert check is not None
            served.call(asyncio.wait_for(asyncio.shield(check), 10))
            warnings = [r.getMessage() for r in caplog.records if "no CUDA" in r.getMessage()]
            assert len(warnings) == (1 if warned else 0)
            # The status names the provider each model runs on.
            stats = served.service.stats()
            assert stats["m"].detail["provider"] == CPU
            assert status.inference(stats)["m"]["provider"] == CPU
        finally:
            served.close()
