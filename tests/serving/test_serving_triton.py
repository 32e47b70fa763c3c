"""The real tritonclient[http] package, unchanged, against mcpd: it cannot dial a Unix socket, so it
talks to the `[serving] http` listener, or to a socat bridge from a loopback port to the socket (as
a user without the listener would)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.mqtt_broker import free_port
from tests.support.serving_models import mixed, scale, strings
from tests.support.serving_server import Served, config
from tests.support.waiting import wait_until

httpclient = pytest.importorskip("tritonclient.http")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
import tritonclient.utils as tritonutils  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(params=["listener", "socat"])
def triton(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[httpclient.InferenceServerClient]:
    models = [
        {"name": "m", "path": str(scale(tmp_path / "scale.onnx")), "max_queue_delay_ms": 0.5},
        {"name": "mixed", "path": str(mixed(tmp_path / "mixed.onnx"))},
        {"name": "strings", "path": str(strings(tmp_path / "strings.onnx"))},
    ]
    port = free_port()
    if request.param == "listener":
        served = Served(config(tmp_path, models, http=f"127.0.0.1:{port}"))
        served.wait_settled()
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        yield client
        client.close()
        served.close()
        return
    if shutil.which("socat") is None:
        pytest.fail("socat is missing: tests/run installs it")
    served = Served(config(tmp_path, models))
    served.wait_settled()
    bridge = subprocess.Popen(
        [
            "socat",
            f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
            f"UNIX-CONNECT:{served.socket}",
        ]
    )

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    wait_until(listening, 10, "socat listening", interval=0.02)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    yield client
    client.close()
    bridge.terminate()
    bridge.wait(10)
    served.close()


def test_health_and_metadata(triton: httpclient.InferenceServerClient) -> None:
    assert triton.is_server_live()
    assert triton.is_server_ready()
    assert triton.is_model_ready("m")
    assert not triton.is_model_ready("nope")
    meta = triton.get_server_metadata()
    assert "binary_tensor_data" in meta["extensions"]
    model = triton.get_model_metadata("m")
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        triton.get_model_metadata("nope")


def test_infer_binary_in_and_out(triton: httpclient.InferenceServerClient) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inp = httpclient.InferInput("x", [2, 4], "FP32")
    inp.set_data_from_numpy(x)  # binary by default
    result = triton.infer("m", [inp], request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("double"), x * 2)
    np.testing.assert_array_equal(result.as_numpy("total"), x.sum(axis=1))
    assert result.get_response()["id"] == "r1"


def test_infer_json_and_mixed_datatypes(triton: httpclient.InferenceServerClient) -> None:
    a = np.array([[1, 2]], np.int64)
    b = np.array([[3, 4]], np.uint8)
    flag = np.array([[True]])
    inputs = []
    for name, array, datatype in (("a", a, "INT64"), ("b", b, "UINT8"), ("flag", flag, "BOOL")):
        item = httpclient.InferInput(name, list(array.shape), datatype)
        item.set_data_from_numpy(array, binary_data=False)
        inputs.append(item)
    outputs = [
        httpclient.InferRequestedOutput("a3", binary_data=False),
        httpclient.InferRequestedOutput("flag_not", binary_data=True),
    ]
    result = triton.infer("mixed", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("a3"), a * 3)
    np.testing.assert_array_equal(result.as_numpy("flag_not"), ~flag)
    assert result.as_numpy("b_out") is None  # not requested


def test_errors_reach_the_client(triton: httpclient.InferenceServerClient) -> None:
    inp = httpclient.InferInput("x", [1, 3], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException, match=r"shape \[1, 3\], expected \[-1, 4\]"):
        triton.infer("m", [inp])


def test_system_shared_memory_in_and_out(triton: httpclient.InferenceServerClient) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    key = f"/mcpd-test-{time.monotonic_ns()}"
    region = shm.create_shared_memory_region("tensors", key, 2 * x.nbytes)
    try:
        shm.set_shared_memory_region(region, [x])
        triton.register_system_shared_memory("tensors", key, 2 * x.nbytes)
        status = triton.get_system_shared_memory_status()
        assert [(r["name"], r["key"], r["byte_size"]) for r in status] == [("tensors", key, 96)]
        inp = httpclient.InferInput("x", [3, 4], "FP32")
        inp.set_shared_memory("tensors", x.nbytes)
        out = httpclient.InferRequestedOutput("double", binary_data=True)
        out.set_shared_memory("tensors", x.nbytes, offset=x.nbytes)
        result = triton.infer("m", [inp], outputs=[out])
        # As Triton answers: no data and no parameters for an output in shared memory.
        assert result.get_output("double") == {
            "name": "double",
            "datatype": "FP32",
            "shape": [3, 4],
        }
        doubled = shm.get_contents_as_numpy(region, np.float32, [3, 4], offset=x.nbytes)
        np.testing.assert_array_equal(doubled, x * 2)
        with pytest.raises(InferenceServerException, match="already registered"):
            triton.register_system_shared_memory("tensors", key, 8)
        triton.unregister_system_shared_memory("tensors")
        assert triton.get_system_shared_memory_status() == []
    finally:
        shm.destroy_shared_memory_region(region)


def test_repository_index_unload_and_load(triton: httpclient.InferenceServerClient) -> None:
    assert "model_repository" in triton.get_server_metadata()["extensions"]
    triton.unload_model("m")
    assert not triton.is_model_ready("m")
    index = {entry["name"]: entry for entry in triton.get_model_repository_index()}
    assert index["m"]["state"] == "UNAVAILABLE" and index["m"]["reason"] == "unloaded"
    assert index["mixed"]["state"] == "READY"
    triton.load_model("m")
    assert triton.is_model_ready("m")
    with pytest.raises(InferenceServerException, match="parameter 'config' is not accepted"):
        triton.load_model("m", config='{"backend": "onnxruntime"}')


TEXT = np.array([["yes", "héllo"], ["", "日本語"]], dtype=object)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_tensors_both_ways(triton: httpclient.InferenceServerClient, binary: bool) -> None:
    inp = httpclient.InferInput("text", [2, 2], "BYTES")
    inp.set_data_from_numpy(TEXT, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput(name, binary_data=binary) for name in ("echo", "code")
    ]
    result = triton.infer("strings", [inp], outputs=outputs)
    echo = result.as_numpy("echo")
    # Binary BYTES come back as bytes, JSON ones as the strings sent (tritonclient's as_numpy).
    expected = [[s.encode() for s in row] for row in TEXT] if binary else TEXT.tolist()
    assert echo.tolist() == expected  # not "b'yes'": the server gave onnxruntime str
    np.testing.assert_array_equal(result.as_numpy("code"), [[1, -1], [-1, -1]])


def test_bytes_tensors_through_shared_memory(triton: httpclient.InferenceServerClient) -> None:
    key = f"/mcpd-test-bytes-{time.monotonic_ns()}"
    serialized = tritonutils.serialize_byte_tensor(TEXT)  # what tritonclient's helper writes
    region = shm.create_shared_memory_region("text", key, 1024)
    try:
        shm.set_shared_memory_region(region, [serialized])
        triton.register_system_shared_memory("text", key, 1024)
        inp = httpclient.InferInput("text", [2, 2], "BYTES")
        inp.set_shared_memory("text", len(serialized.item()))
        out = httpclient.InferRequestedOutput("echo", binary_data=True)
        out.set_shared_memory("text", 512, offset=512)
        triton.infer("strings", [inp], outputs=[out])
        echo = shm.get_contents_as_numpy(region, np.object_, [2, 2], offset=512)
        assert echo.tolist() == [[s.encode() for s in row] for row in TEXT]
        triton.unregister_system_shared_memory("text")
    finally:
        shm.destroy_shared_memory_region(region)


def test_statistics_count_rows_and_batches_as_triton_does(
    triton: httpclient.InferenceServerClient,
) -> None:
    assert "statistics" in triton.get_server_metadata()["extensions"]
    before = triton.get_inference_statistics("m")["model_stats"][0]
    assert (before["name"], before["version"], before["inference_count"]) == ("m", "1", 0)
    for rows in (3, 1):
        inp = httpclient.InferInput("x", [rows, 4], "FP32")
        inp.set_data_from_numpy(np.ones((rows, 4), np.float32))
        triton.infer("m", [inp])
    (stats,) = triton.get_inference_statistics("m")["model_stats"]
    assert (stats["inference_count"], stats["execution_count"]) == (4, 2)
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == 2 and inference["fail"]["count"] == 0
    for part in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inference[part]["count"] == 2, part
    assert inference["success"]["ns"] > inference["compute_infer"]["ns"] > 0
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (1, 1), (3, 1),
    ]  # fmt: skip
    assert stats["last_inference"] > 0
    every = triton.get_inference_statistics()["model_stats"]
    assert [s["name"] for s in every] == ["m", "mixed", "strings"]
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        triton.get_inference_statistics("nope")


def test_model_configuration_as_triton_describes_it(
    triton: httpclient.InferenceServerClient,
) -> None:
    assert "model_configuration" in triton.get_server_metadata()["extensions"]
    config = triton.get_model_config("m")
    assert {k: config[k] for k in ("name", "platform", "backend", "max_batch_size")} == {
        "name": "m", "platform": "onnxruntime_onnx", "backend": "onnxruntime", "max_batch_size": 8,
    }  # fmt: skip
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("x", "TYPE_FP32", [4])
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("double", "TYPE_FP32", [4]), ("total", "TYPE_FP32", []),
    ]  # fmt: skip
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    mixed_types = {t["name"]: t["data_type"] for t in triton.get_model_config("mixed")["input"]}
    assert mixed_types == {"a": "TYPE_INT64", "b": "TYPE_UINT8", "flag": "TYPE_BOOL"}


def test_cuda_shared_memory_is_answered_as_by_a_server_without_cuda(
    triton: httpclient.InferenceServerClient,
) -> None:
    assert triton.get_cuda_shared_memory_status() == []
    triton.unregister_cuda_shared_memory()
    triton.unregister_cuda_shared_memory("anything")
    with pytest.raises(InferenceServerException, match="Unable to find cuda shared memory"):
        triton.get_cuda_shared_memory_status("anything")
