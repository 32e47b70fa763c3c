"""Building OpenVINO candidates (docs/optimizer.md, "OpenVINO and NNCF", has the sources): the ONNX
model as OpenVINO reads it, written as IR (`<name>.xml` with its `<name>.bin`) with the precision
it is to run at stored in it by the serving backend's store_precision, so that the file alone
says how it was measured and serving compiles it the same way (docs/openvino.md §7); INT8 by
NNCF's post-training quantization, and its accuracy-aware variant.

The model is read with Core.read_model, not ov.convert_model, and NNCF is imported with its
telemetry off: both would otherwise send usage statistics to Intel's analytics service by
default (openvino/tools/ovc/telemetry_utils.py, nncf/telemetry/wrapper.py), which an optimizer
on an edge box must not do.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from mcpd.optimize.plan import HINTS, device_family
from mcpd.optimize.samples import Sample
from mcpd.serving.backends.openvino import runtime, store_precision

ACCURACY_AWARE_ITERATIONS = 16
"""At most this many groups of operations given back to float by the accuracy-aware search, one
per iteration (each a compile and a pass over its samples): NNCF's default is every quantized
operation, and on PP-OCRv4's recognizer 8 iterations already took 65 s here."""
NNCF_DEVICES = {"CPU": "CPU", "GPU": "GPU", "NPU": "NPU"}
"""NNCF's TargetDevice for an OpenVINO device: quantization schemes the device runs fast."""


def _read(source: Path) -> Any:
    return runtime().Core().read_model(str(source))


def _save(model: Any, target: Path, precision: str) -> Path:
    """Write `model` as IR at `target` (.xml, .bin beside it), to run at `precision`. Weights
    are kept as they are: save_model would compress float weights to FP16 by default, which an
    f32 candidate must not be measured without."""
    store_precision(model, HINTS[precision])
    runtime().save_model(model, str(target), compress_to_fp16=False)
    return target


def float_ir(source: Path, target: Path, precision: str) -> Path:
    """The model unchanged, to run at `precision` (fp32, bf16, fp16): no calibration, only the
    inference precision OpenVINO computes in."""
    return _save(_read(source), target, precision)


@contextlib.contextmanager
def _nncf() -> Iterator[Any]:
    """NNCF, imported with its telemetry off and its own logging quiet; its progress bars and
    messages go to stderr (stdout belongs to --json)."""
    os.environ["NNCF_CI"] = "1"  # the switch nncf/telemetry/wrapper.py reads at import
    try:
        import nncf
    except ImportError as exc:
        raise RuntimeError(f"needs NNCF: pip install 'mcpd[openvino]' ({exc})") from None
    # Its logger's level alone: nncf.set_log_level also sets the level of every handler its
    # logger holds, which can be the host's (pytest's capture handlers were left at ERROR).
    logging.getLogger("nncf").setLevel(logging.ERROR)
    with contextlib.redirect_stdout(sys.stderr):
        yield nncf


def _settings(nncf: Any, transformer: bool, device: str, samples: int) -> dict[str, Any]:
    """What mcpd asks of nncf.quantize: the MIXED preset (symmetric weights, asymmetric
    activations, for activations that are not centred on zero, as after ReLU), the TRANSFORMER
    model type where the graph has attention, fast bias correction, the device's scheme, and every
    calibration sample (NNCF's default subset is 300)."""
    return {
        "preset": nncf.QuantizationPreset.MIXED,
        "model_type": nncf.ModelType.TRANSFORMER if transformer else None,
        "fast_bias_correction": True,
        "target_device": getattr(nncf.TargetDevice, NNCF_DEVICES[device_family(device)]),
        "subset_size": samples,
    }


def int8_ir(
    source: Path,
    target: Path,
    calibration: list[Sample],
    precision: str,
    transformer: bool,
    device: str,
) -> Path:
    """NNCF's post-training INT8 of the model, its operations left in float running at
    `precision`."""
    with _nncf() as nncf:
        quantized = nncf.quantize(
            _read(source),
            nncf.Dataset(calibration),
            **_settings(nncf, transformer, device, len(calibration)),
        )
    return _save(quantized, target, precision)


def quantizers(path: Path) -> int:
    """The activation quantizers (FakeQuantize operations) of an INT8 IR: NNCF folds those of
    the weights into INT8 constants."""
    return sum(op.get_type_name() == "FakeQuantize" for op in _read(path).get_ops())


Checked = tuple[Sample, list[Any]]
"""A sample and the original model's outputs on it."""


def accuracy_aware_ir(
    source: Path,
    target: Path,
    calibration: list[Sample],
    checked: list[Checked],
    metric: Callable[[list[list[Any]], list[list[Any]]], float],
    max_drop: float,
    transformer: bool,
    device: str,
) -> Path:
    """NNCF's accuracy-aware INT8 (quantize_with_accuracy_control): quantized as int8_ir, then
    the operations that add the most error are given back to float, one group per iteration,
    until `metric` (reference outputs, the model's outputs -> a score; the original scores the
    highest) is within `max_drop` of the float model's on the `checked` samples. NNCF runs both
    models at f32 while it searches (its accuracy_control/openvino_backend.py), so the result is
    stored to run at fp32."""

    def validate(compiled: Any, items: Iterable[Checked]) -> float:
        chosen = list(items)
        got = [list(compiled(sample).to_tuple()) for sample, _ in chosen]
        return metric([expected for _, expected in chosen], got)

    with _nncf() as nncf:
        quantized = nncf.quantize_with_accuracy_control(
            _read(source),
            nncf.Dataset(calibration),
            nncf.Dataset(checked, lambda item: item[0]),  # validate gets the pairs
            validate,
            max_drop=max_drop,
            drop_type=nncf.DropType.ABSOLUTE,
            advanced_accuracy_restorer_parameters=nncf.AdvancedAccuracyRestorerParameters(
                max_num_iterations=ACCURACY_AWARE_ITERATIONS
            ),
            **_settings(nncf, transformer, device, len(calibration)),
        )
    return _save(quantized, target, "fp32")
