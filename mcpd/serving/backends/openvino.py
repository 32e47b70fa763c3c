"""OpenVINO backend (Intel's runtime: x86 CPUs, Intel iGPUs and NPUs) on the native `openvino`
Python API, imported only when a model needs it (`pip install 'mcpd[openvino]'`).

It reads OpenVINO IR (`.xml`, with its weights in the `.bin` beside it) and ONNX files alike and
compiles the model once for `[models.openvino] device`. The CPU is tested; GPU, NPU and AUTO are
passed to OpenVINO as they are, untested on hardware. The batch dimension stays as the model
declares it: the CPU runs a dynamic batch natively (as fast as a static one, docs/openvino.md §3),
and a fixed one is padded by the worker as for every backend, so there is one compiled model per
loaded model and nothing compiled per batch size.

compile_options and open_compiled are the one place compile settings are made: `mcpd bench` (and
`mcpd optimize`'s OpenVINO candidates) compile through them, so what is measured is what serves.
The contract with the optimizer: a built OpenVINO model is an IR pair `<name>.xml`/`<name>.bin`
whose inference precision is stored in the IR itself (store_precision: rt_info
`mcpd/inference_precision`), so that the file alone says how it was measured. Serving uses
`[models.openvino] precision` where it is set, else the one stored in the file, else OpenVINO's
default (bf16 on CPUs with AMX); the precision in force is read back from the compiled model.

A CompiledModel is thread-safe, an InferRequest is not: each thread that calls `run` gets its own
request. InferRequest.infer releases the GIL while it runs (docs/openvino.md §4).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mcpd.config import ModelSection, OpenVinoOptions
from mcpd.placement.plan import UNPLACED, ModelPlacement
from mcpd.serving.backends import fixed_batch, served_datatype
from mcpd.serving.errors import LoadError
from mcpd.serving.tensors import TensorSpec

OV_TYPES = {
    "boolean": "BOOL",
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "u64": "UINT64",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "f16": "FP16",
    "f32": "FP32",
    "f64": "FP64",
}
"""OpenVINO element types (Type.get_type_name) as the protocol's datatypes. Not from
Type.to_dtype(), which gives float16 for bf16 and uint8 for u4."""
SCHEDULING_CORE_TYPES = {"core": "PCORE_ONLY", "atom": "ECORE_ONLY"}
"""ov::hint::scheduling_core_type for a model placed on one kind of an Intel hybrid part's cores."""
PRECISION_KEY = ["mcpd", "inference_precision"]
"""Where store_precision keeps an IR's inference precision in its rt_info."""


def runtime() -> Any:
    """The openvino module, or a LoadError that says what to install."""
    try:
        import openvino
    except ImportError as exc:
        raise LoadError(
            f"the openvino backend needs OpenVINO: pip install 'mcpd[openvino]' ({exc})"
        ) from exc
    return openvino


def compile_options(
    device: str,
    precision: str,
    threads: int,
    streams: int = 1,
    placement: ModelPlacement = UNPLACED,
) -> dict[str, str]:
    """OpenVINO's compile properties for a model served with these settings (docs/openvino.md §2).

    One stream (the LATENCY hint) puts every thread on each batch. More streams (the THROUGHPUT
    hint) split the threads between them and pay only with as many batches in flight, which the
    model's worker keeps (OpenVinoBackend.parallel); `mcpd bench` measures both. `threads` is the
    whole model's (INFERENCE_NUM_THREADS, shared by its streams);
    0 and "auto" leave OpenVINO's choice. Threads and streams are CPU properties, not set elsewhere.
    A placed model (the placement plan) has a thread per placed CPU, on SMT siblings only where
    the plan put threads on them, on the plan's kind of hybrid core, and OpenVINO's own pinning
    off: with it on, the first inference set the calling thread's CPUs to every CPU of the
    process (measured here: a worker on CPU 1 ran on 0-1 after it, and the inference ran on that
    thread), while off, OpenVINO's threads stay within the CPUs of the threads that load and run
    the model, which the plan sets (docs/openvino.md §2).
    """
    options = {"PERFORMANCE_HINT": "LATENCY" if streams == 1 else "THROUGHPUT"}
    if device == "CPU":
        options["NUM_STREAMS"] = str(streams)
        if placement.thread_cpus:
            threads = len(placement.thread_cpus)
            options["ENABLE_CPU_PINNING"] = "NO"
            options["ENABLE_HYPER_THREADING"] = "YES" if placement.smt else "NO"
            if placement.core_type is not None:
                options["SCHEDULING_CORE_TYPE"] = SCHEDULING_CORE_TYPES[placement.core_type]
        if threads:
            options["INFERENCE_NUM_THREADS"] = str(threads)
    if precision != "auto":
        options["INFERENCE_PRECISION_HINT"] = precision
    return options


def store_precision(model: Any, precision: str) -> None:
    """Record in an ov.Model (saved with it by ov.save_model) the precision it is to run at."""
    model.set_rt_info(precision, PRECISION_KEY)


def stored_precision(model: Any) -> str | None:
    return (
        model.get_rt_info(PRECISION_KEY).astype(str) if model.has_rt_info(PRECISION_KEY) else None
    )


def open_compiled(
    path: str | Path, options: OpenVinoOptions, placement: ModelPlacement = UNPLACED
) -> Any:
    """The model file compiled as mcpd serves it: a CompiledModel. Blocking (seconds for a big
    model)."""
    ov = runtime()
    core = ov.Core()
    try:
        model = core.read_model(str(path))
        precision: str = options.precision
        if precision == "auto":
            precision = stored_precision(model) or "auto"
        settings = compile_options(
            options.device, precision, options.threads, options.streams, placement
        )
        return core.compile_model(model, options.device, settings)
    except RuntimeError as exc:  # OpenVINO raises RuntimeError subclasses for every failure
        weights = Path(path).with_suffix(".bin")  # an IR's, which OpenVINO's message leaves out
        ir = Path(path).suffix.lower() == ".xml"
        missing = f" ({weights} is missing)" if ir and not weights.exists() else ""
        raise LoadError(
            f"OpenVINO cannot load {path} on {options.device}: {reason(exc)}{missing}"
        ) from exc


def reason(exc: Exception) -> str:
    """An OpenVINO error without its "Exception from src/….cpp:N:" lines (one per C++ frame)."""
    lines = [line.strip() for line in str(exc).splitlines()]
    said = [line for line in lines if line and not line.startswith("Exception from ")]
    return " ".join(said) or type(exc).__name__


def precision_in_force(compiled: Any) -> str:
    """The inference precision the compiled model runs at: "f32", "bf16", "f16"."""
    return str(compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name())


def capabilities(device: str) -> list[str]:
    """What OpenVINO says the device runs natively (OPTIMIZATION_CAPABILITIES: FP32, BF16, INT8,
    FP16, …)."""
    return [
        str(name) for name in runtime().Core().get_property(device, "OPTIMIZATION_CAPABILITIES")
    ]


def device_report() -> dict[str, Any] | None:
    """`mcpd probe`'s `openvino`: its version and each device it finds, with its name, what it
    runs natively and its default inference precision; None without OpenVINO."""
    try:
        ov = runtime()
    except LoadError:
        return None
    core = ov.Core()
    devices = []
    for device in core.available_devices:
        default = core.get_property(device, "INFERENCE_PRECISION_HINT")
        devices.append(
            {
                "name": device,
                "full_name": str(core.get_property(device, "FULL_DEVICE_NAME")),
                "capabilities": capabilities(device),
                "default_precision": str(default.get_type_name()),
            }
        )
    return {"version": str(ov.__version__).split("-")[0], "devices": devices}


def _specs(ports: Sequence[Any]) -> tuple[TensorSpec, ...]:
    specs = []
    for port in ports:
        name = port.get_any_name()
        shape = port.get_partial_shape()
        if shape.rank.is_dynamic:
            raise LoadError(f"tensor {name!r} has no fixed rank, which mcpd does not serve")
        datatype = served_datatype(OV_TYPES, name, port.get_element_type().get_type_name())
        dims = tuple(d.get_length() if d.is_static else -1 for d in shape)
        specs.append(TensorSpec(name, datatype, dims))
    return tuple(specs)


class OpenVinoBackend:
    kind = "openvino"
    warnings: tuple[str, ...] = ()

    def __init__(self, model: ModelSection, placement: ModelPlacement) -> None:
        self.platform = "openvino_ir" if model.suffix == ".xml" else "openvino_onnx"
        self._compiled = open_compiled(model.path, model.openvino, placement=placement)
        self.inputs = _specs(self._compiled.inputs)
        self.outputs = _specs(self._compiled.outputs)
        self.fixed_batch = fixed_batch(self.inputs, self.outputs)
        # How many inferences OpenVINO runs at once: the streams it compiled to, which may be
        # fewer than asked for (one thread at least each), docs/openvino.md §2.
        self.parallel = int(self._compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self._requests: dict[int, Any] = {}
        self._lock = threading.Lock()
        # The device that runs it: AUTO names the one it chose.
        device = str(self._compiled.get_property("EXECUTION_DEVICES")[0])
        self.detail = {
            "device": model.openvino.device,
            "precision": precision_in_force(self._compiled),
            "capabilities": capabilities(device),
        }
        self._warm_up()

    def _warm_up(self) -> None:
        """The first inference allocates and, for a dynamic shape, prepares kernels: pay that
        before "ready"."""
        rows = self.fixed_batch or 1
        if all(-1 not in spec.shape[1:] for spec in self.inputs):
            self.run([np.zeros((rows, *spec.shape[1:]), spec.dtype) for spec in self.inputs])

    def _request(self) -> Any:
        """This thread's InferRequest (a thread id is reused only after its thread ended)."""
        thread = threading.get_ident()
        request = self._requests.get(thread)
        if request is None:
            with self._lock:
                request = self._requests[thread] = self._compiled.create_infer_request()
        return request

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        # Copies in and out (share_inputs/share_outputs off): a request's output tensors are
        # overwritten by its next inference, while the results of this one are still being sent.
        results = self._request().infer(list(inputs))
        return list(results.to_tuple())

    def close(self) -> None:
        with self._lock:
            self._requests.clear()
        del self._compiled


def open_model(model: ModelSection, placement: ModelPlacement) -> OpenVinoBackend:
    return OpenVinoBackend(model, placement)
