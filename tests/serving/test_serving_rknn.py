"""The RKNN backend against a fake rknnlite that enforces the documented contract (return codes,
not exceptions). Untested on hardware: there is no RK3588 here."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from mcpd.config import ModelSection
from mcpd.serving import backends
from mcpd.serving.errors import LoadError
from tests.support.fake_rknn import model


def test_loads_by_extension_learns_outputs_and_serves_a_fixed_batch(
    lite: ModuleType, tmp_path: Path
) -> None:
    backend = backends.load(model(tmp_path, [2, 8, 8, 3], core_mask="0_1_2"))
    assert backend.kind == "rknn" and backend.fixed_batch == 2
    assert [(s.name, s.datatype, s.shape) for s in backend.outputs] == [
        ("output0", "FP32", (2, 8, 8, 3))
    ]
    assert ("init_runtime", {"target": None, "core_mask": 7}) in lite.calls
    x = np.full((2, 8, 8, 3), 3, np.uint8)
    (out,) = backend.run([x])
    np.testing.assert_array_equal(out, np.full((2, 8, 8, 3), 6.0))
    assert lite.calls[-1] == ("inference", {"shapes": [(2, 8, 8, 3)], "format": None})
    backend.close()
    assert lite.calls[-1] == ("release", {})


def test_nchw_is_passed_per_input(lite: ModuleType, tmp_path: Path) -> None:
    backend = backends.load(model(tmp_path, [1, 3, 4, 4], data_format="nchw"))
    backend.run([np.zeros((1, 3, 4, 4), np.uint8)])
    assert lite.calls[-1][1]["format"] == ["nchw"]


def test_return_codes_become_load_errors(lite: ModuleType, tmp_path: Path) -> None:
    section = model(tmp_path, [1, 4])
    Path(section.path).write_bytes(b"not a model")
    with pytest.raises(LoadError, match=r"RKNNLite.load_rknn\(.*m.rknn\) failed \(returned -1\)"):
        backends.load(section)
    lite.MACHINE = "x86_64"
    with pytest.raises(LoadError, match=r"init_runtime\(core_mask=0\) on .* failed"):
        backends.load(model(tmp_path, [1, 4]))
    lite.MACHINE, lite.SOC = "aarch64", "rk3576"
    with pytest.raises(LoadError, match="core 2 does not exist on RK3576"):
        backends.load(model(tmp_path, [1, 4], core_mask="2"))
    assert lite.calls[-1] == ("release", {})  # nothing is left half-initialised


def test_inference_failure_is_none_not_an_exception(lite: ModuleType, tmp_path: Path) -> None:
    backend = backends.load(model(tmp_path, [1, 4]))
    lite.fail_inference = True
    try:
        with pytest.raises(RuntimeError, match=r"RKNNLite.inference failed \(returned None\)"):
            backend.run([np.zeros((1, 4), np.uint8)])
    finally:
        lite.fail_inference = False


def test_inputs_must_be_declared(lite: ModuleType, tmp_path: Path) -> None:
    section = dataclasses.replace(
        model(tmp_path, [1, 4]), rknn=ModelSection(name="x", path="x").rknn
    )
    with pytest.raises(LoadError, match=r"needs its inputs declared in \[\[models.rknn.inputs\]\]"):
        backends.load(section)


def test_missing_rknnlite_is_a_clear_load_error(tmp_path: Path) -> None:
    assert "rknnlite" not in sys.modules
    with pytest.raises(LoadError, match="the rknn backend needs rknn-toolkit-lite2"):
        backends.load(model(tmp_path, [1, 4]))
