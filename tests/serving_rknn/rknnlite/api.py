"""A fake `rknnlite.api.RKNNLite` that enforces the documented contract of rknn-toolkit-lite2 2.3.2
(docs/serving-protocol.md §4), so the RKNN backend is tested against the behaviour it will meet:

- no method raises: failures are logged and reported as -1 (load_rknn, init_runtime) or None
  (inference), exactly as the real wrapper catches its exceptions;
- load_rknn only reads the file; init_runtime needs a loaded model, target=None works only on an
  aarch64/armv7l board, core_mask must be one of the NPU_CORE_* values and core 2 does not exist
  on RK3576; calling init_runtime again releases the previous runtime first;
- inference needs an initialised runtime and inputs matching the model, data_format is None or a
  list of 'nhwc'/'nchw'.

A fake model file is b"RKNN" followed by JSON {"inputs": [[shape], ...]}; its one output is the
first input times two, as float32.
"""

from __future__ import annotations

import json
import platform
from typing import Any

import numpy as np

MACHINE = platform.machine()
"""Tests set "aarch64" to play an RK3588 board."""
SOC = "rk3588"
calls: list[tuple[str, dict[str, Any]]] = []
fail_inference = False
"""Tests set True to make the NPU fail the next inferences (returns None, as the real one)."""


class RKNNLite:
    NPU_CORE_AUTO = 0
    NPU_CORE_0 = 1
    NPU_CORE_1 = 2
    NPU_CORE_2 = 4
    NPU_CORE_0_1 = 3
    NPU_CORE_0_1_2 = 7
    NPU_CORE_ALL = 0xFFFF

    def __init__(self, verbose: bool = False, verbose_file: str | None = None) -> None:
        self._model: dict[str, Any] | None = None
        self._runtime: int | None = None

    def load_rknn(self, path: str) -> int:
        calls.append(("load_rknn", {"path": path}))
        try:
            with open(path, "rb") as file:
                data = file.read()
            if data[:4] != b"RKNN":
                raise ValueError("not an RKNN model")
            self._model = json.loads(data[4:])
            return 0
        except Exception as exc:  # the real wrapper catches everything too
            print(f"E load_rknn: {exc}")
            return -1

    def init_runtime(
        self,
        target: str | None = None,
        device_id: str | None = None,
        async_mode: bool = False,
        core_mask: int = NPU_CORE_AUTO,
    ) -> int:
        calls.append(("init_runtime", {"target": target, "core_mask": core_mask}))
        self._runtime = None  # a second call releases the previous runtime first
        if self._model is None:
            print("E init_runtime: model is not loaded yet")
            return -1
        if target is None and MACHINE not in ("aarch64", "armv7l"):
            print("E init_runtime: RKNN Lite does not support simulator on this platform")
            return -1
        valid = {0, 1, 2, 4, 3, 7, 0xFFFF}
        if SOC == "rk3576":
            valid -= {4, 7}
        if core_mask not in valid:
            print(f"E init_runtime: invalid core_mask {core_mask}")
            return -1
        self._runtime = core_mask
        return 0

    def inference(
        self,
        inputs: list[np.ndarray],
        data_type: str | None = None,
        data_format: list[str] | str | None = None,
        inputs_pass_through: list[int] | None = None,
        get_frame_id: bool = False,
    ) -> list[np.ndarray] | None:
        calls.append(("inference", {"shapes": [a.shape for a in inputs], "format": data_format}))
        try:
            if self._runtime is None or self._model is None:
                raise RuntimeError("runtime is not initialised")
            if fail_inference:
                raise RuntimeError("NPU job timed out")
            shapes = [tuple(shape) for shape in self._model["inputs"]]
            if [tuple(a.shape) for a in inputs] != shapes:
                raise ValueError(f"input shapes {[a.shape for a in inputs]}, model has {shapes}")
            if data_format is not None and (
                not isinstance(data_format, list)
                or any(f not in ("nhwc", "nchw") for f in data_format)
            ):
                raise ValueError(f"invalid data_format {data_format!r}")
            return [np.asarray(inputs[0], np.float32) * 2]
        except Exception as exc:
            print(f"E inference: {exc}")
            return None

    def release(self) -> None:
        calls.append(("release", {}))
        self._runtime = None
        self._model = None
