"""A stand-in for rknn-toolkit2's `rknn.api.RKNN` (2.5.0) for the tests that run in CI: the real
toolkit pins old numpy/onnx/torch and takes minutes to install, so it is tested behind the opt-in
command in tests/optimize/test_optimize_rknn.py. This one keeps the contract mcpd's worker relies on
(mcpd/optimize/rknn_worker.py, docs/optimizer.md):

- no method raises: failure is a non-zero return code (inference: None);
- config, then load_onnx (the named inputs and their sizes), then build (with a dataset file of
  one line per sample, one .npy path per input, when quantizing); export_rknn, init_runtime
  (target None: the simulator) and accuracy_analysis need a built model; inference needs a runtime;
- accuracy_analysis takes one .npy path per model input, of the declared size, and writes
  output_dir/error_analysis.txt beside the folders of per-layer snapshots (golden/, simulator/).

Its simulator is exact (it runs the float model with onnxruntime), and the analysis it writes is
a file the real toolkit wrote: the one named by MCPD_FAKE_RKNN_ANALYSIS, or none at all when that
is "none"; "fail" makes accuracy_analysis return -1.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

PLATFORMS = ("rk3588", "rk3576", "rk3568", "rk3566", "rk3562")
ALGORITHMS = ("normal", "mmse", "kl_divergence")


class RKNN:
    def __init__(self, verbose: bool = False) -> None:
        self._config: dict[str, Any] | None = None
        self._session: ort.InferenceSession | None = None
        self._sizes: list[list[int]] = []
        self._built = False
        self._runtime = False

    def config(self, target_platform: str | None = None, **options: Any) -> int:
        algorithm = options.get("quantized_algorithm", "normal")
        if target_platform not in PLATFORMS or algorithm not in ALGORITHMS:
            print(f"E config: invalid target_platform {target_platform} or {algorithm}")
            return -1
        self._config = {"target_platform": target_platform, **options}
        return 0

    def load_onnx(
        self, model: str, inputs: list[str] | None = None, input_size_list: Any = None
    ) -> int:
        if self._config is None:
            print("E load_onnx: config first")
            return -1
        try:
            self._session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        except Exception as exc:  # the real one catches everything too
            print(f"E load_onnx: {exc}")
            return -1
        names = [i.name for i in self._session.get_inputs()]
        if inputs != names or input_size_list is None or len(input_size_list) != len(names):
            print(f"E load_onnx: inputs {inputs} do not match the model's {names}")
            return -1
        self._sizes = [list(size) for size in input_size_list]
        return 0

    def build(self, do_quantization: bool = True, dataset: str | None = None) -> int:
        if self._session is None:
            print("E build: load a model first")
            return -1
        if do_quantization:
            rows = Path(dataset).read_text().split("\n") if dataset else []
            if not any(rows) or any(len(row.split()) != len(self._sizes) for row in rows if row):
                print(f"E build: dataset {dataset} has no samples of {len(self._sizes)} inputs")
                return -1
        self._built = True
        return 0

    def export_rknn(self, export_path: str) -> int:
        if not self._built:
            print("E export_rknn: build first")
            return -1
        Path(export_path).write_bytes(b"RKNN fake")
        return 0

    def init_runtime(self, target: str | None = None, **options: Any) -> int:
        self._runtime = self._built and target is None  # no board attached here
        return 0 if self._runtime else -1

    def inference(
        self, inputs: list[np.ndarray], data_format: list[str] | None = None, **options: Any
    ) -> list[np.ndarray] | None:
        if not self._runtime or self._session is None:
            print("E inference: init_runtime first")
            return None
        names = [i.name for i in self._session.get_inputs()]
        try:
            return list(self._session.run(None, dict(zip(names, inputs, strict=True))))
        except Exception as exc:  # the real one catches everything too
            print(f"E inference: {exc}")
            return None

    def accuracy_analysis(
        self,
        inputs: list[str],
        output_dir: str = "./snapshot",
        target: str | None = None,
        device_id: str | None = None,
    ) -> int:
        shapes = [list(np.load(path).shape) for path in inputs if os.path.isfile(path)]
        if not self._built or shapes != self._sizes:
            print(f"E accuracy_analysis: inputs {inputs} are not {self._sizes}")
            return -1
        fixture = os.environ.get("MCPD_FAKE_RKNN_ANALYSIS", "none")
        if fixture == "fail":
            return -1
        for snapshots in ("golden", "simulator"):  # every layer's output, as the real one
            os.makedirs(os.path.join(output_dir, snapshots), exist_ok=True)
            Path(output_dir, snapshots, "layer.txt").write_text("0.0\n" * 1000)
        if fixture != "none":
            shutil.copyfile(fixture, os.path.join(output_dir, "error_analysis.txt"))
        return 0

    def release(self) -> None:
        self._session = None
        self._built = self._runtime = False
