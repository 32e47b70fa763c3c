"""A placed model's threads in each runtime: onnxruntime's intra-op pool pinned CPU by CPU through
session.intra_op_thread_affinities (its ids counted from 1), OpenVINO compiled with the plan's
threads, pinning, hyper-threading and hybrid core type; the loading thread back where it was."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from mcpd.config import ModelSection
from mcpd.demo import MODEL
from mcpd.placement.plan import ModelPlacement
from mcpd.serving import backends
from mcpd.serving.backends.onnxrt import thread_affinities
from mcpd.serving.backends.openvino import compile_options
from tests.support.affinity import allowed

IMAGE = np.zeros((2, 3, 64, 64), np.float32)
HERE = tuple(sorted(os.sched_getaffinity(0)))


def placed(*cpus: int, **facts: object) -> ModelPlacement:
    return ModelPlacement(cpus, allowed=tuple(sorted(set(cpus))), **facts)  # type: ignore[arg-type]


def test_onnxruntimes_affinities_leave_out_the_callers_thread_and_count_from_one() -> None:
    assert thread_affinities((4, 5, 6, 7)) == "6;7;8"
    assert thread_affinities((0,)) == ""
    assert thread_affinities(()) == ""


@pytest.mark.skipif(len(HERE) < 2, reason="a pool needs two CPUs to be told apart")
def test_onnxruntimes_pool_threads_run_on_the_plans_cpus() -> None:
    """Two threads on the last two CPUs, the caller's first: the one pool thread onnxruntime
    starts is pinned to the second, and the loading thread is back on every CPU after."""
    first, second = HERE[-2:]
    before = set(allowed(os.getpid()))
    backend = backends.load(ModelSection(name="m", path=str(MODEL)), placed(first, second))
    try:
        started = {tid: cpus for tid, cpus in allowed(os.getpid()).items() if tid not in before}
        assert frozenset({second}) in started.values(), started
        assert os.sched_getaffinity(0) == set(HERE)  # the loading thread, restored
        assert backend.run([IMAGE])[0].shape[0] == 2
    finally:
        backend.close()


def test_a_model_skipped_by_the_plan_is_built_as_before() -> None:
    backend = backends.load(ModelSection(name="m", path=str(MODEL)), ModelPlacement(allowed=HERE))
    try:
        assert backend.run([IMAGE])[0].shape[0] == 2
    finally:
        backend.close()


def test_openvino_takes_the_plans_threads_pinning_and_core_type() -> None:
    assert compile_options("CPU", "auto", 0, placement=placed(0, 2, 4, core_type="core")) == {
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": "1",
        "ENABLE_CPU_PINNING": "NO",
        "ENABLE_HYPER_THREADING": "NO",
        "SCHEDULING_CORE_TYPE": "PCORE_ONLY",
        "INFERENCE_NUM_THREADS": "3",
    }
    on_siblings = compile_options("CPU", "auto", 8, placement=placed(12, 13, smt=True))
    assert on_siblings["ENABLE_HYPER_THREADING"] == "YES"
    assert on_siblings["INFERENCE_NUM_THREADS"] == "2"  # the plan's, over [models.openvino]'s
    assert "SCHEDULING_CORE_TYPE" not in on_siblings
    assert compile_options("GPU", "auto", 0, placement=placed(0, 1)) == {
        "PERFORMANCE_HINT": "LATENCY"
    }


def test_openvino_runs_a_placed_model_on_its_cpu_and_leaves_the_worker_there() -> None:
    """Compiled on a loading thread and run on a worker, both on the model's CPU, as serving
    does: the settings are in force and the worker is still on that CPU after its inferences
    (OpenVINO's own pinning moved it to every CPU)."""
    cpu = HERE[-1]
    model = placed(cpu)
    done: dict[str, object] = {}

    def load() -> None:
        done["backend"] = backends.load(
            ModelSection(name="m", path=str(MODEL), backend="openvino"), model
        )

    def work() -> None:
        os.sched_setaffinity(0, model.allowed)
        backend = done["backend"]
        for _ in range(5):
            backend.run([IMAGE])  # type: ignore[attr-defined]
        done["worker"] = os.sched_getaffinity(0)

    for step in (load, work):
        thread = threading.Thread(target=step)
        thread.start()
        thread.join()
    compiled = done["backend"]._compiled  # type: ignore[attr-defined]
    assert compiled.get_property("INFERENCE_NUM_THREADS") == 1
    assert compiled.get_property("ENABLE_CPU_PINNING") is False
    assert done["worker"] == {cpu}
