"""The onnxruntime backend: provider planning with fallback, the optimized-graph cache, models it
cannot serve, and the bundled demo model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from mcpd.config import ModelSection, OnnxRuntimeOptions
from mcpd.demo import MODEL
from mcpd.demo.build import classifier
from mcpd.serving import backends
from mcpd.serving.backends.onnxrt import plan_providers, trt_profile
from mcpd.serving.errors import LoadError
from mcpd.serving.tensors import TensorSpec
from tests.support.serving_models import scale, sequence

CPU = "CPUExecutionProvider"
ALL = ["TensorrtExecutionProvider", "CUDAExecutionProvider", CPU]


def test_provider_order_and_options_where_available() -> None:
    options = OnnxRuntimeOptions(trt_cache_dir="/var/cache/trt", trt_fp16=True, device_id=1)
    profile = {"trt_profile_min_shapes": "x:1x4"}
    providers, warning = plan_providers(options, ALL, profile)
    assert warning is None
    assert providers == [
        (
            "TensorrtExecutionProvider",
            {
                "device_id": 1,
                "trt_fp16_enable": True,
                "trt_engine_cache_enable": True,
                "trt_engine_cache_path": "/var/cache/trt",
                "trt_profile_min_shapes": "x:1x4",
            },
        ),
        ("CUDAExecutionProvider", {"device_id": 1}),
        (CPU, {}),
    ]


def test_missing_providers_fall_back_to_cpu_with_a_warning() -> None:
    providers, warning = plan_providers(OnnxRuntimeOptions(providers=("cuda",)), [CPU], {})
    assert providers == [(CPU, {})]
    assert warning == (
        "CUDAExecutionProvider not available in this onnxruntime build (it has "
        "CPUExecutionProvider); using CPUExecutionProvider"
    )


def test_trt_profile_covers_every_batch_size_the_governor_may_pick() -> None:
    specs = [TensorSpec("image", "FP32", (-1, 3, 8, 8)), TensorSpec("k", "INT64", (-1, 2))]
    assert trt_profile(specs, 8) == {
        "trt_profile_min_shapes": "image:1x3x8x8,k:1x2",
        "trt_profile_opt_shapes": "image:8x3x8x8,k:8x2",
        "trt_profile_max_shapes": "image:8x3x8x8,k:8x2",
    }
    assert trt_profile([TensorSpec("x", "FP32", (-1, -1))], 8) == {}


def test_default_providers_run_on_cpu_here_and_say_so(tmp_path: Path) -> None:
    backend = backends.load(ModelSection(name="m", path=str(scale(tmp_path / "s.onnx"))))
    assert backend.detail["provider"] == CPU
    # Said by the repository, once a minute at most (tests/serving/test_serving_loads.py).
    [warning] = backend.warnings
    assert warning.startswith("TensorrtExecutionProvider, CUDAExecutionProvider not available")


def test_optimized_graph_is_cached_and_reused(tmp_path: Path) -> None:
    cache = tmp_path / "cache.onnx"
    options = OnnxRuntimeOptions(
        providers=("cpu",), optimized_model_path=str(cache), intra_op_threads=1
    )
    section = ModelSection(name="m", path=str(scale(tmp_path / "s.onnx")), onnxruntime=options)
    first = backends.load(section)
    assert cache.exists() and first.detail["cached_graph"] is False
    second = backends.load(section)
    assert second.detail["cached_graph"] is True
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(first.run([x])[0], second.run([x])[0])


def test_models_that_cannot_be_served(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(LoadError, match="onnxruntime cannot load"):
        backends.load(ModelSection(name="m", path=str(garbage)))
    with pytest.raises(LoadError, match=r"cannot tell the backend from extension '\.pt'"):
        backends.load(ModelSection(name="m", path=str(tmp_path / "m.pt")))
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Identity", ["s"], ["t"])],
            "g",
            [onnx.helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [])],
            [onnx.helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [])],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    onnx.save(model, tmp_path / "scalar.onnx")
    with pytest.raises(LoadError, match="tensor 's' is a scalar"):
        backends.load(ModelSection(name="m", path=str(tmp_path / "scalar.onnx")))


def test_free_non_batch_dimensions_are_served(tmp_path: Path) -> None:
    backend = backends.load(ModelSection(name="m", path=str(sequence(tmp_path / "q.onnx"))))
    assert backend.inputs[0].metadata()["shape"] == [-1, -1]
    assert backend.run([np.ones((1, 7), np.float32)])[0].shape == (1, 7)


def test_bundled_demo_model_is_what_the_generator_writes(tmp_path: Path) -> None:
    onnx.save(classifier(), tmp_path / "demo.onnx")
    assert (tmp_path / "demo.onnx").read_bytes() == MODEL.read_bytes()
    backend = backends.load(ModelSection(name="demo", path=str(MODEL)))
    (scores,) = backend.run([np.zeros((2, 3, 64, 64), np.float32)])
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, rtol=1e-5)
