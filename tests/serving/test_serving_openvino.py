"""The openvino backend on real OpenVINO: its compile settings, IR and ONNX served through the
socket, concurrent requests batched and answered exactly as OpenVINO answers the same batch
in-process, a fixed-batch model, the precision in force and where it comes from, what it cannot
serve, and the load error without OpenVINO."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import openvino
import pytest

from mcpd.client import Client
from mcpd.config import ModelSection, OpenVinoOptions
from mcpd.demo import MODEL
from mcpd.placement.plan import ModelPlacement
from mcpd.serving import backends
from mcpd.serving.backends.openvino import compile_options, open_compiled, precision_in_force
from mcpd.serving.errors import LoadError
from tests.conftest import PROJECT
from tests.support.openvino_cpu import BLOCKED, DEFAULT_PRECISION
from tests.support.serving_models import ir, scale
from tests.support.serving_server import Served, config
from tests.support.waiting import wait_until
from tests.support.worker import Gated


def test_serving_compiles_one_stream_with_the_models_threads_and_precision() -> None:
    assert compile_options("CPU", "auto", 0) == {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}
    assert compile_options("CPU", "f32", 2) == {
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": "1",
        "INFERENCE_NUM_THREADS": "2",
        "INFERENCE_PRECISION_HINT": "f32",
    }
    assert compile_options("CPU", "bf16", 4, streams=2) == {
        "PERFORMANCE_HINT": "THROUGHPUT",
        "NUM_STREAMS": "2",
        "INFERENCE_NUM_THREADS": "4",
        "INFERENCE_PRECISION_HINT": "bf16",
    }
    # Threads and streams are the CPU's properties: another device gets the hints alone.
    assert compile_options("GPU.1", "f16", 2) == {
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "f16",
    }


@contextmanager
def gated_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **keys: object
) -> Iterator[tuple[Served, Gated]]:
    """The demo classifier as IR, served by the real openvino backend behind a gate, with these
    [[models]] keys."""
    gates: list[Gated] = []
    real = backends.load

    def load(section: ModelSection, placement: ModelPlacement) -> Gated:
        gates.append(Gated(real(section, placement)))
        return gates[-1]

    monkeypatch.setattr(backends, "load", load)
    (tmp_path / MODEL.name).write_bytes(MODEL.read_bytes())
    path = str(ir(tmp_path / MODEL.name))
    served = Served(config(tmp_path, [{"name": "demo", "path": path, **keys}]))
    served.wait_settled()
    try:
        yield served, gates[0]
    finally:
        gates[0].gate.set()
        served.close()


@pytest.fixture
def gated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Served, Gated]]:
    with gated_demo(tmp_path, monkeypatch, max_queue_delay_ms=0) as served_and_gate:
        yield served_and_gate


def infer_demo(served: Served, image: np.ndarray) -> np.ndarray:
    with Client(served.socket, timeout=30) as client:
        return client.infer("demo", {"image": image})["scores"]


def test_concurrent_requests_are_batched_and_answered_as_openvino_does_in_process(
    gated: tuple[Served, Gated], tmp_path: Path
) -> None:
    served, gate = gated
    rng = np.random.default_rng(7)
    images = [rng.standard_normal((rows, 3, 64, 64)).astype(np.float32) for rows in (1, 2, 1, 3)]

    worker = served.service.repository.entries["demo"].worker
    assert worker is not None
    with ThreadPoolExecutor(len(images)) as pool:
        first = pool.submit(infer_demo, served, images[0])  # holds the model at the gate
        assert gate.entered.wait(10)
        answers = [first]
        for queued, image in enumerate(images[1:], start=1):  # queued in a known order
            answers.append(pool.submit(infer_demo, served, image))
            wait_until(lambda n=queued: worker.depth >= n, 10, f"{queued} queued", interval=0.005)
        gate.gate.set()
        scores = [answer.result(30) for answer in answers]
    assert gate.batches == [1, 6]  # the three queued requests ran as one batch of six rows
    # OpenVINO in-process, compiled as serving compiles it, on the same two batches.
    compiled = open_compiled(tmp_path / "demo.xml", OpenVinoOptions())
    request = compiled.create_infer_request()
    alone = request.infer([images[0]]).to_tuple()[0]
    together = request.infer([np.concatenate(images[1:])]).to_tuple()[0]
    np.testing.assert_array_equal(scores[0], alone)
    np.testing.assert_array_equal(np.concatenate(scores[1:]), together)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two streams need two CPUs")
def test_with_two_streams_two_batches_run_at_once_each_answered_as_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(8)
    images = [rng.standard_normal((rows, 3, 64, 64)).astype(np.float32) for rows in (1, 2, 3)]
    with gated_demo(tmp_path, monkeypatch, openvino={"streams": 2, "threads": 2}) as (served, gate):
        assert gate.parallel == 2  # read back from the compiled model
        worker = served.service.repository.entries["demo"].worker
        assert worker is not None
        with ThreadPoolExecutor(len(images)) as pool:
            answers = [pool.submit(infer_demo, served, images[0])]
            assert gate.entered.wait(10)
            answers.append(pool.submit(infer_demo, served, images[1]))
            wait_until(lambda: len(gate.batches) == 2, 10, "a second batch running beside")
            answers.append(pool.submit(infer_demo, served, images[2]))
            wait_until(lambda: worker.depth == 1, 10, "the third queued", interval=0.005)
            gate.gate.set()
            scores = [answer.result(30) for answer in answers]
        assert gate.batches == [1, 2, 3]
        with served.client() as client:
            reply = client.request("GET", "/v2/models/demo/config").json()
        assert reply["instance_group"][0]["count"] == 2
    compiled = open_compiled(tmp_path / "demo.xml", OpenVinoOptions(streams=2, threads=2))
    assert compiled.get_property("NUM_STREAMS") == 2
    request = compiled.create_infer_request()
    for image, score in zip(images, scores, strict=True):
        np.testing.assert_array_equal(score, request.infer([image]).to_tuple()[0])


def test_ir_and_onnx_serve_alike_and_a_fixed_batch_is_padded(tmp_path: Path) -> None:
    models = [
        {"name": "ir", "path": str(ir(scale(tmp_path / "ir.onnx")))},
        {"name": "onnx", "path": str(scale(tmp_path / "o.onnx")), "backend": "openvino"},
        {"name": "fixed", "path": str(scale(tmp_path / "f4.onnx", batch=4)), "backend": "openvino"},
    ]
    served = Served(config(tmp_path, models))
    try:
        served.wait_settled()
        stats = served.service.stats()
        assert {name: stats[name].detail["backend"] for name in stats} == dict.fromkeys(
            ("ir", "onnx", "fixed"), "openvino"
        )
        assert stats["fixed"].detail["fixed_batch"] == 4
        with served.client() as client:
            for name in ("ir", "onnx", "fixed"):
                for rows in (1, 6):  # the fixed model: padded to 4, then 4 + 2 padded
                    x = np.arange(4 * rows, dtype=np.float32).reshape(rows, 4)
                    out = client.infer(name, {"x": x})
                    np.testing.assert_array_equal(out["double"], 2 * x)
                    np.testing.assert_array_equal(out["total"], x.sum(axis=1))
            metadata = client.model_metadata("ir")
            assert metadata["platform"] == "openvino_ir"
            assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
            assert client.model_metadata("onnx")["platform"] == "openvino_onnx"
            reply = client.request("GET", "/v2/models/ir/config").json()
            assert (reply["backend"], reply["instance_group"][0]["kind"]) == (
                "openvino",
                "KIND_CPU",
            )
    finally:
        served.close()


def test_run_is_thread_safe(tmp_path: Path) -> None:
    backend = backends.load(ModelSection(name="m", path=str(ir(scale(tmp_path / "s.onnx")))))
    try:
        inputs = [np.full((rows, 4), rows, np.float32) for rows in range(1, 9)]
        with ThreadPoolExecutor(4) as pool:
            for _ in range(5):
                outputs = list(pool.map(backend.run, [[x] for x in inputs]))
                for x, (double, total) in zip(inputs, outputs, strict=True):
                    np.testing.assert_array_equal(double, 2 * x)
                    np.testing.assert_array_equal(total, x.sum(axis=1))
    finally:
        backend.close()


def test_the_precision_in_force_comes_from_the_config_then_the_ir_then_openvino(
    tmp_path: Path,
) -> None:
    stored = ir(scale(tmp_path / "stored.onnx"), precision="f32")
    plain = ir(scale(tmp_path / "plain.onnx"))

    def precision(path: Path, wanted: str) -> object:
        options = OpenVinoOptions(precision=wanted)  # type: ignore[arg-type]
        backend = backends.load(ModelSection(name="m", path=str(path), openvino=options))
        backend.close()
        return backend.detail["precision"]

    assert precision(stored, "auto") == "f32"
    assert precision(plain, "auto") == DEFAULT_PRECISION
    assert precision(plain, "f32") == "f32"
    assert precision_in_force(open_compiled(stored, OpenVinoOptions())) == "f32"
    capabilities = backends.load(ModelSection(name="m", path=str(plain))).detail["capabilities"]
    assert "FP32" in capabilities  # type: ignore[operator]
    if "BF16" in capabilities:  # type: ignore[operator]
        assert precision(stored, "bf16") == "bf16"  # the config wins over the file


def test_what_it_cannot_load_is_a_load_error_naming_it(tmp_path: Path) -> None:
    opset = openvino.opset13
    x = opset.parameter([-1, 4], openvino.Type.bf16, name="x")
    openvino.save_model(openvino.Model([opset.relu(x)], [x]), str(tmp_path / "bf16.xml"))
    with pytest.raises(LoadError, match="tensor 'x' has type bf16, which mcpd does not serve"):
        backends.load(ModelSection(name="m", path=str(tmp_path / "bf16.xml")))
    xml = ir(scale(tmp_path / "s.onnx"))
    xml.with_suffix(".bin").unlink()
    missing = rf"OpenVINO cannot load {xml} on CPU: .* \({xml.with_suffix('.bin')} is missing\)$"
    with pytest.raises(LoadError, match=missing):
        backends.load(ModelSection(name="m", path=str(xml)))


def test_without_openvino_the_load_error_says_what_to_install(tmp_path: Path) -> None:
    path = scale(tmp_path / "s.onnx")
    code = BLOCKED + (
        "from mcpd.config import ModelSection\n"
        "from mcpd.serving import backends\n"
        f"backends.load(ModelSection(name='m', path={str(path)!r}, backend='openvino'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith(
        "mcpd.serving.errors.LoadError: the openvino backend needs OpenVINO: "
        "pip install 'mcpd[openvino]' (import of openvino halted; None in sys.modules)"
    )
