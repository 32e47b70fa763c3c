"""What Triton's tools ask of a model besides inference: its statistics (Triton's statistics
extension, docs/serving-protocol.md §8.3) and its configuration (the model configuration
extension, §8.4), as JSON documents built from what mcpd has: the recorder's snapshot, the
[[models]] table and the loaded backend.
"""

from __future__ import annotations

from collections.abc import Mapping

from mcpd.config import ModelSection
from mcpd.serving.backends import Backend
from mcpd.serving.codec import VERSION
from mcpd.serving.tensors import TensorSpec
from mcpd.snapshot import Duration, Statistics

NO_CACHE = {"count": 0, "ns": 0}
"""mcpd has no response cache; perf_analyzer reads cache_hit and cache_miss all the same."""
INSTANCE_KINDS = {
    "CUDAExecutionProvider": "KIND_GPU",
    "TensorrtExecutionProvider": "KIND_GPU",
    "GPU": "KIND_GPU",
    "NPU": "KIND_MODEL",
    "AUTO": "KIND_MODEL",
}
"""Where a model runs (onnxruntime's provider, OpenVINO's device) as Triton's instance_group kind;
CPU otherwise. An RKNN model, or an OpenVINO one on an NPU or AUTO, runs where its runtime places
it: KIND_MODEL."""
INPUT_FLAGS = {"is_shape_tensor": False, "allow_ragged_batch": False, "optional": False}


def _duration(duration: Duration) -> dict[str, int]:
    return {"count": duration.count, "ns": duration.ns}


def model_stats(name: str, statistics: Statistics) -> dict[str, object]:
    """One $model_stat."""
    s = statistics
    return {
        "name": name,
        "version": VERSION,
        "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": _duration(s.success),
            "fail": _duration(s.fail),
            "queue": _duration(s.queue),
            "compute_input": _duration(s.compute_input),
            "compute_infer": _duration(s.compute_infer),
            "compute_output": _duration(s.compute_output),
            "cache_hit": NO_CACHE,
            "cache_miss": NO_CACHE,
        },
        "batch_stats": [
            {
                "batch_size": batch.batch_size,
                "compute_input": _duration(batch.compute_input),
                "compute_infer": _duration(batch.compute_infer),
                "compute_output": _duration(batch.compute_output),
            }
            for batch in s.batches
        ],
    }


def config_datatype(datatype: str) -> str:
    """The protocol's datatype as a model configuration's TYPE_* (§1.4: STRING is BYTES)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _tensor(spec: TensorSpec) -> dict[str, object]:
    return {
        "name": spec.name,
        "data_type": config_datatype(spec.datatype),
        "dims": list(spec.shape[1:]),  # max_batch_size > 0: dims leave the batch axis out
    }


def model_config(model: ModelSection, backend: Backend) -> dict[str, object]:
    """The ModelConfig of a loaded model: what it serves as, not a Triton repository's file.
    Fields mcpd has no notion of (ensembles, sequences, warm-up, …) are left out."""
    where = str(backend.detail.get("provider") or backend.detail.get("device"))
    kind = (
        "KIND_MODEL"
        if backend.kind == "rknn"
        else INSTANCE_KINDS.get(where.split(".")[0], "KIND_CPU")  # GPU.1 is a GPU
    )
    return {
        "name": model.name,
        "platform": backend.platform,
        "backend": backend.kind,
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": model.max_batch,
        "input": [
            {**_tensor(spec), "format": "FORMAT_NONE", **INPUT_FLAGS} for spec in backend.inputs
        ],
        "output": [{**_tensor(spec), "is_shape_tensor": False} for spec in backend.outputs],
        "dynamic_batching": {
            "preferred_batch_size": list(model.preferred_batch_sizes),
            "max_queue_delay_microseconds": round(model.max_queue_delay_ms * 1000),
            "preserve_ordering": False,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": model.timeout_ms * 1000,
                "allow_timeout_override": True,
                "max_queue_size": model.max_queue_size,
            },
        },
        # As many batches run at once as the backend runs (mcpd.serving.worker): Triton's count.
        "instance_group": [{"name": model.name, "kind": kind, "count": backend.parallel}],
    }


def all_stats(snapshots: Mapping[str, Statistics]) -> dict[str, object]:
    """The $stats_model_response for these models, by name."""
    return {"model_stats": [model_stats(name, s) for name, s in sorted(snapshots.items())]}
