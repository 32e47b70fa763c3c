"""Calibration samples from a folder: `*.npy` (one sample of a single-input model, with or without
a leading batch axis of 1), `*.npz` (input name -> array), or images (`*.jpg`, `*.jpeg`, `*.png`)
turned into the model's input by a stated preprocessing (see `Preprocess`). Every sample is checked
against the model's inputs here, so a bad one is named before any work starts."""

from __future__ import annotations

import sys
import zipfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from mcpd.optimize.interface import OptimizeError, TensorSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 (JetPack 6)
    import tomli as tomllib

Sample = dict[str, np.ndarray]
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
SIDECAR = "preprocess.toml"


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes an input tensor: resize to `size` (height, width), channels in
    `order`, x = (pixel * scale - mean) / std per channel, then `layout`."""

    size: tuple[int, int]
    order: str = "rgb"
    scale: float = 1 / 255
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    layout: str = "nchw"

    @classmethod
    def parse(cls, text: str, source: str) -> Preprocess:
        """`size=224 order=rgb mean=0.485,0.456,0.406 std=0.229,0.224,0.225 layout=nchw`
        (the same keys a sidecar preprocess.toml holds)."""
        values: dict[str, object] = {}
        for item in text.split():
            key, sep, value = item.partition("=")
            if not sep:
                raise OptimizeError(f"{source}: {item!r} is not KEY=VALUE")
            parts = value.split(",")
            values[key] = parts[0] if len(parts) == 1 else parts
        return cls.from_mapping(values, source)

    @classmethod
    def from_mapping(cls, values: dict[str, object], source: str) -> Preprocess:
        known = {"size", "order", "scale", "mean", "std", "layout"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise OptimizeError(
                f"{source}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        if "size" not in values:
            raise OptimizeError(f"{source}: size is required (size=H,W or size=N)")
        try:
            size = _floats(values["size"], (1, 2))
            spec = cls(
                size=(int(size[0]), int(size[-1])),
                order=str(values.get("order", "rgb")),
                scale=_floats(values.get("scale", 1 / 255), (1,))[0],
                mean=_triple(values.get("mean", 0.0)),
                std=_triple(values.get("std", 1.0)),
                layout=str(values.get("layout", "nchw")),
            )
        except (TypeError, ValueError) as exc:
            raise OptimizeError(f"{source}: {exc}") from None
        if spec.order not in ("rgb", "bgr"):
            raise OptimizeError(f"{source}: order must be rgb or bgr, not {spec.order!r}")
        if spec.layout not in ("nchw", "nhwc"):
            raise OptimizeError(f"{source}: layout must be nchw or nhwc, not {spec.layout!r}")
        if min(spec.size) < 1 or 0.0 in spec.std:
            raise OptimizeError(f"{source}: size must be positive and std non-zero")
        return spec

    def apply(self, path: Path, spec: TensorSpec) -> np.ndarray:
        try:
            from PIL import Image
        except ImportError:
            raise OptimizeError("reading images needs Pillow: pip install pillow") from None
        try:
            with Image.open(path) as image:
                rgb = image.convert("RGB").resize(
                    (self.size[1], self.size[0]), Image.Resampling.BILINEAR
                )
                pixels = np.asarray(rgb, dtype=np.float32)
        except OSError as exc:
            raise OptimizeError(f"{path}: not a readable image ({exc})") from None
        if self.order == "bgr":
            pixels = pixels[..., ::-1]
        mean = np.array(self.mean, np.float32)
        std = np.array(self.std, np.float32)
        pixels = (pixels * np.float32(self.scale) - mean) / std
        if self.layout == "nchw":
            pixels = pixels.transpose(2, 0, 1)
        dtype = spec.dtype if spec.dtype is not None else np.dtype(np.float32)
        return np.ascontiguousarray(pixels[np.newaxis], dtype=dtype)


def _floats(value: object, lengths: tuple[int, ...]) -> list[float]:
    items = value if isinstance(value, list | tuple) else [value]
    if len(items) not in lengths:
        raise ValueError(f"expected {' or '.join(map(str, lengths))} numbers, got {value!r}")
    # Fractions read `1/255` as well as decimals.
    return [float(Fraction(str(item))) for item in items]


def _triple(value: object) -> tuple[float, float, float]:
    numbers = _floats(value, (1, 3))
    return (numbers[0], numbers[-1 if len(numbers) == 1 else 1], numbers[-1])


def _fit(array: np.ndarray, spec: TensorSpec, source: str) -> np.ndarray:
    """`array` as one sample (batch 1) of input `spec`, or an error naming both shapes."""
    want = spec.shape
    if want is not None and array.ndim == len(want) - 1:
        array = array[np.newaxis]
    got = "x".join(map(str, array.shape))
    wanted = (
        "?" if want is None else "x".join("?" if not isinstance(d, int) else str(d) for d in want)
    )
    if want is not None and (
        array.ndim != len(want)
        or array.shape[0] != 1
        or any(
            isinstance(d, int) and d != n for d, n in zip(want[1:], array.shape[1:], strict=True)
        )
    ):
        raise OptimizeError(
            f"{source}: input {spec.name!r} has shape {got}, the model wants {wanted} (batch 1)"
        )
    if spec.dtype is not None and array.dtype != spec.dtype:
        raise OptimizeError(
            f"{source}: input {spec.name!r} is {array.dtype}, the model wants {spec.dtype}"
        )
    return np.ascontiguousarray(array)


def _load_npz(path: Path, inputs: tuple[TensorSpec, ...]) -> Sample:
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise OptimizeError(f"{path}: not a readable .npz file ({exc})") from None
    names = {spec.name for spec in inputs}
    missing = sorted(names - set(arrays))
    extra = sorted(set(arrays) - names)
    if missing or extra:
        problem = f"lacks input {missing[0]!r}" if missing else f"has {extra[0]!r}, not an input"
        raise OptimizeError(f"{path}: {problem} (the model's inputs: {', '.join(sorted(names))})")
    return {spec.name: _fit(arrays[spec.name], spec, str(path)) for spec in inputs}


def _load_one(path: Path, inputs: tuple[TensorSpec, ...], preprocess: Preprocess | None) -> Sample:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _load_npz(path, inputs)
    if len(inputs) != 1:
        names = ", ".join(spec.name for spec in inputs)
        raise OptimizeError(
            f"{path}: a {suffix} sample fits a single-input model; this one has {names} (use .npz)"
        )
    spec = inputs[0]
    if suffix == ".npy":
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise OptimizeError(f"{path}: not a readable .npy file ({exc})") from None
        return {spec.name: _fit(array, spec, str(path))}
    if preprocess is None:
        raise OptimizeError(
            f"{path}: images need a preprocessing: --preprocess 'size=H,W mean=... std=...' "
            f"or a {SIDECAR} beside them"
        )
    return {spec.name: _fit(preprocess.apply(path, spec), spec, str(path))}


def sidecar(folder: Path) -> Preprocess | None:
    path = folder / SIDECAR
    if not path.is_file():
        return None
    try:
        values = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise OptimizeError(f"{path}: {exc}") from None
    return Preprocess.from_mapping(values, str(path))


def load(
    folder: Path, inputs: tuple[TensorSpec, ...], preprocess: Preprocess | None = None
) -> list[Sample]:
    """Every sample in `folder`, in name order; `preprocess` falls back to the sidecar file."""
    if not folder.is_dir():
        raise OptimizeError(f"{folder}: no such calibration folder")
    files = sorted(
        p for p in folder.iterdir() if p.suffix.lower() in (".npy", ".npz", *IMAGE_SUFFIXES)
    )
    if not files:
        raise OptimizeError(f"{folder}: no calibration samples (*.npy, *.npz, *.jpg, *.png)")
    if len(files) < 2:
        raise OptimizeError(f"{folder}: one sample; at least 2 are needed to hold one out")
    preprocess = preprocess or sidecar(folder)
    return [_load_one(path, inputs, preprocess) for path in files]


def split(samples: list[Sample], limit: int = 64) -> tuple[list[Sample], list[Sample]]:
    """Calibration and validation parts: every fourth sample is held out (at least one), and each
    part is capped at `limit` samples to bound the search's time."""
    validation = samples[3::4] or samples[-1:]
    held = {id(s) for s in validation}
    calibration = [s for s in samples if id(s) not in held]
    return calibration[:limit], validation[:limit]
