"""onnxruntime backend: provider order TensorRT -> CUDA -> CPU where available, threads, graph
optimization level and an optimized-model cache (docs/serving-protocol.md §5).

Session.run releases the GIL and is thread-safe (onnxruntime PR #19301), so batches run on the
model's worker thread while the event loop and the control loop carry on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from mcpd.config import ModelSection, OnnxRuntimeOptions
from mcpd.placement.plan import ModelPlacement
from mcpd.serving.backends import fixed_batch, served_datatype
from mcpd.serving.errors import LoadError
from mcpd.serving.tensors import TensorSpec

PROVIDERS = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

GPU_PROVIDERS = (PROVIDERS["tensorrt"], PROVIDERS["cuda"])

Provider = tuple[str, dict[str, Any]]


def available_providers() -> list[str]:
    """The execution providers this onnxruntime build has, in its order of preference."""
    return list(ort.get_available_providers())


def gpu_missing(platform: str, available: Sequence[str]) -> str | None:
    """The warning for a Jetson whose onnxruntime has neither GPU provider: PyPI's aarch64
    onnxruntime is built for the CPU alone (docs/serving-protocol.md §5.7), so a board that
    has a GPU would serve on the CPU without a word."""
    if not platform.startswith("jetson") or any(p in available for p in GPU_PROVIDERS):
        return None
    return (
        f"this {platform} board's onnxruntime has no CUDA or TensorRT provider (it has "
        f"{', '.join(available)}): models run on the CPU, not the GPU; install JetPack's "
        'onnxruntime-gpu (README, "The GPU on Jetson")'
    )


def plan_providers(
    options: OnnxRuntimeOptions, available: Sequence[str], trt_profile: Mapping[str, str]
) -> tuple[list[Provider], str | None]:
    """The providers to ask for, with their options, and a warning if some are missing.

    CPU always closes the list: a board whose onnxruntime lacks the GPU providers still serves.
    """
    chosen: list[Provider] = []
    missing = []
    for name in options.providers:
        provider = PROVIDERS[name]
        if provider not in available:
            missing.append(provider)
            continue
        settings: dict[str, Any] = {}
        if name == "tensorrt":
            settings = {"device_id": options.device_id, "trt_fp16_enable": options.trt_fp16}
            if options.trt_cache_dir:
                settings["trt_engine_cache_enable"] = True
                settings["trt_engine_cache_path"] = options.trt_cache_dir
            settings.update(trt_profile)
        elif name == "cuda":
            settings = {"device_id": options.device_id}
        chosen.append((provider, settings))
    if not any(provider == PROVIDERS["cpu"] for provider, _ in chosen):
        chosen.append((PROVIDERS["cpu"], {}))
    warning = None
    if missing:
        warning = (
            f"{', '.join(missing)} not available in this onnxruntime build (it has "
            f"{', '.join(available)}); using {', '.join(provider for provider, _ in chosen)}"
        )
    return chosen, warning


def trt_profile(inputs: Sequence[TensorSpec], max_batch: int) -> dict[str, str]:
    """Pin TensorRT's optimization profile to batch 1..max_batch so that no batch size the governor
    picks makes it rebuild the engine at run time (docs/serving-protocol.md §5.3). Only possible with static other dims."""
    if any(-1 in spec.shape[1:] for spec in inputs):
        return {}

    def shapes(batch: int) -> str:
        return ",".join(
            f"{spec.name}:{'x'.join(str(d) for d in (batch, *spec.shape[1:]))}" for spec in inputs
        )

    return {
        "trt_profile_min_shapes": shapes(1),
        "trt_profile_opt_shapes": shapes(max_batch),
        "trt_profile_max_shapes": shapes(max_batch),
    }


def _specs(args: Sequence[Any]) -> tuple[TensorSpec, ...]:
    specs = []
    for arg in args:
        datatype = served_datatype(ORT_TYPES, arg.name, arg.type)
        shape = tuple(d if isinstance(d, int) and d > 0 else -1 for d in arg.shape)
        specs.append(TensorSpec(arg.name, datatype, shape))
    return tuple(specs)


def thread_affinities(thread_cpus: Sequence[int]) -> str:
    """onnxruntime's `session.intra_op_thread_affinities` for threads on `thread_cpus`: one entry
    per intra-op thread but the first, which is the caller's own (onnxruntime pins none of it and
    wants intra_op_num_threads - 1 entries), each a processor id counted from 1
    (onnxruntime/core/util/thread_utils.cc: "Processor id must start from 1")."""
    return ";".join(str(cpu + 1) for cpu in thread_cpus[1:])


class OnnxBackend:
    kind = "onnxruntime"
    platform = "onnxruntime_onnx"
    parallel = 1

    def __init__(self, model: ModelSection, placement: ModelPlacement) -> None:
        self.name = model.name
        options = model.onnxruntime
        available = available_providers()
        profile: dict[str, str] = {}
        if "tensorrt" in options.providers and PROVIDERS["tensorrt"] in available:
            probe = self._session(model.path, "disable", 1, "", [(PROVIDERS["cpu"], {})])
            profile = trt_profile(_specs(probe.get_inputs()), model.max_batch)
        providers, warning = plan_providers(options, available, profile)
        warnings = [warning] if warning else []
        path, level, cache = model.path, options.graph_optimization_level, ""
        if options.optimized_model_path:
            if len(providers) > 1:
                warnings.append(
                    "optimized_model_path is ignored with GPU providers (their compiled nodes "
                    "cannot be saved); use trt_cache_dir"
                )
            elif _fresh(options.optimized_model_path, model.path):
                path, level = options.optimized_model_path, "disable"
            else:
                cache = options.optimized_model_path
        threads = len(placement.thread_cpus) or options.intra_op_threads
        affinities = thread_affinities(placement.thread_cpus)
        self._session_obj = self._session(path, level, threads, cache, providers, affinities)
        used = self._session_obj.get_providers()
        wanted = providers[0][0]
        if wanted not in used:
            warnings.append(f"{wanted} failed to start; running on {used[0]}")
        self.warnings = tuple(warnings)
        self.inputs = _specs(self._session_obj.get_inputs())
        self.outputs = _specs(self._session_obj.get_outputs())
        self.fixed_batch = fixed_batch(self.inputs, self.outputs)
        self._input_names = [spec.name for spec in self.inputs]
        self._output_names = [spec.name for spec in self.outputs]
        self.detail = {"provider": used[0], "cached_graph": path != model.path}
        self._warm_up()

    def _warm_up(self) -> None:
        """onnxruntime's first run allocates and plans (milliseconds); pay that before "ready"."""
        rows = self.fixed_batch or 1
        if all(-1 not in spec.shape[1:] for spec in self.inputs):
            self.run([np.zeros((rows, *spec.shape[1:]), spec.dtype) for spec in self.inputs])

    @staticmethod
    def _session(
        path: str,
        level: str,
        threads: int,
        cache: str,
        providers: list[Provider],
        affinities: str = "",
    ) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.graph_optimization_level = LEVELS[level]
        options.log_severity_level = 3  # errors only: onnxruntime's warnings are not actionable
        if threads:
            options.intra_op_num_threads = threads
        if affinities:
            options.add_session_config_entry("session.intra_op_thread_affinities", affinities)
        if cache:
            options.optimized_model_filepath = cache
        try:
            return ort.InferenceSession(path, sess_options=options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own untyped Fail/InvalidGraph errors
            raise LoadError(f"onnxruntime cannot load {path}: {exc}") from exc

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = dict(zip(self._input_names, inputs, strict=False))
        return list(self._session_obj.run(self._output_names, feeds))

    def close(self) -> None:
        del self._session_obj


def _fresh(cache: str, source: str) -> bool:
    try:
        return os.stat(cache).st_mtime >= os.stat(source).st_mtime
    except OSError:
        return False


def open_model(model: ModelSection, placement: ModelPlacement) -> OnnxBackend:
    return OnnxBackend(model, placement)
