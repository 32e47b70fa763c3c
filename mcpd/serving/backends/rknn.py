"""RKNN backend (RK3588/RK3576 NPU) through rknn-toolkit-lite2's `RKNNLite`.

UNTESTED ON HARDWARE: it is written to the documented contract of rknn-toolkit-lite2 2.3.2
(docs/serving-protocol.md §4) and tested against a fake module that enforces that contract. Every
RKNNLite call reports failure by a return code (-1) or None, never an exception, so each one is
checked here. Inputs are declared in the config (RKNNLite cannot describe them); outputs are learned
from one warm-up inference with zeros, which also proves the runtime works before we say "ready".
"""

from __future__ import annotations

import logging
import platform
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from mcpd.config import ModelSection
from mcpd.placement.plan import ModelPlacement
from mcpd.serving.backends import fixed_batch
from mcpd.serving.errors import LoadError
from mcpd.serving.tensors import TensorSpec, datatype_of

log = logging.getLogger("mcpd.serving")

CORE_MASKS = {"auto": 0, "0": 1, "1": 2, "2": 4, "0_1": 3, "0_1_2": 7, "all": 0xFFFF}
"""RKNNLite.NPU_CORE_* values (rknnlite/api/rknn_lite.py)."""


def _runtime_class() -> Any:
    try:
        from rknnlite.api import RKNNLite
    except ImportError as exc:
        raise LoadError(
            "the rknn backend needs rknn-toolkit-lite2 (aarch64 only: pip install 'mcpd[rknn]' "
            f"on the board): {exc}"
        ) from exc
    return RKNNLite


class RknnBackend:
    kind = "rknn"
    platform = "rknn_rknn"
    parallel = 1
    warnings: tuple[str, ...] = ()

    def __init__(self, model: ModelSection) -> None:
        options = model.rknn
        if not options.inputs:
            raise LoadError("an rknn model needs its inputs declared in [[models.rknn.inputs]]")
        self.inputs = tuple(
            TensorSpec(spec.name, spec.datatype, spec.shape) for spec in options.inputs
        )
        # None is RKNNLite's default (NHWC); a layout is only meaningful for 4-D inputs.
        self._format = (
            [options.data_format] * len(self.inputs) if options.data_format == "nchw" else None
        )
        self._lock = threading.Lock()  # one RKNNLite context is not documented as thread-safe
        self._lite = _runtime_class()()
        try:
            self._check(self._lite.load_rknn(model.path), f"load_rknn({model.path})")
            mask = CORE_MASKS[options.core_mask]
            self._check(
                self._lite.init_runtime(core_mask=mask),
                f"init_runtime(core_mask={mask}) on {platform.machine()} "
                "(needs an RK3588/RK3576 board with the NPU driver; core 2 does not exist on RK3576)",
            )
            warm = self.run([np.zeros(spec.shape, spec.dtype) for spec in self.inputs])
            self.outputs = tuple(
                TensorSpec(f"output{index}", datatype_of(array.dtype), array.shape)
                for index, array in enumerate(warm)
            )
            self.fixed_batch = fixed_batch(self.inputs, self.outputs)
        except Exception:
            self._lite.release()
            raise
        self.detail = {"core_mask": options.core_mask}

    @staticmethod
    def _check(code: object, call: str) -> None:
        if code != 0:
            raise LoadError(f"RKNNLite.{call} failed (returned {code}); see the log above")

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        with self._lock:
            outputs = self._lite.inference(inputs=list(inputs), data_format=self._format)
        if outputs is None:
            raise RuntimeError("RKNNLite.inference failed (returned None); see the log above")
        return [np.asarray(output) for output in outputs]

    def close(self) -> None:
        with self._lock:
            self._lite.release()


def open_model(model: ModelSection, placement: ModelPlacement) -> RknnBackend:
    """The NPU runs the model: of the placement only the worker thread's CPU applies (the
    worker pins itself), which waits for the NPU and copies tensors."""
    return RknnBackend(model)
