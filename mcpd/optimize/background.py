"""Optimizing a served model in the background: `mcpd optimize` runs as its own process at the
lowest CPU priority (`nice -n 19`), never in the daemon's, and its result is cached under the state
directory by the model's content hash, the options and the toolchain's versions, so a restart or a
reload reuses it at once.

Standard library only: the daemon imports this module, and the optimizer's own imports (onnx,
onnxruntime.quantization) stay in the child process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from mcpd import __version__
from mcpd.config import ModelSection

log = logging.getLogger("mcpd.optimize")

RESULT = "result.json"


class BuildError(Exception):
    """The optimizer failed; the message is its own one-line reason."""


@dataclass(frozen=True)
class Built:
    path: Path
    precision: str
    speedup: float | None
    cosine_min: float
    top1_agreement: float | None
    cached: bool
    runtime: str = "onnxruntime"
    """The runtime the file was measured in, whose backend serves it: onnxruntime or openvino."""

    def summary(self) -> dict[str, object]:
        return {
            "runtime": self.runtime,
            "precision": self.precision,
            "speedup": self.speedup,
            "cosine_min": self.cosine_min,
            "top1_agreement": self.top1_agreement,
        }


def _toolchain() -> str:
    versions = [f"mcpd {__version__}"]
    for package in ("onnxruntime", "onnx", "openvino", "nncf"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} none")
    return ", ".join(versions)


def cache_key(model: ModelSection) -> str:
    """Content hash of the model and the calibration samples, the options (the backend and
    OpenVINO's device among them: they decide the runtimes measured), and the toolchain."""
    digest = hashlib.sha256()
    with open(model.path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    folder = Path(model.calibration)
    for sample in sorted(p for p in folder.iterdir() if p.is_file()):
        digest.update(sample.name.encode())
        digest.update(sample.read_bytes())
    target = [model.optimize, model.min_cosine, model.backend, model.openvino.device]
    digest.update(json.dumps([*target, _toolchain()]).encode())
    return digest.hexdigest()[:32]


def _read(entry: Path) -> Built:
    doc = json.loads((entry / RESULT).read_text(encoding="utf-8"))
    accuracy = doc["accuracy"]
    return Built(
        entry / Path(doc["output"]).name,
        doc["precision"],
        doc["speedup"],
        accuracy["cosine_min"],
        accuracy["top1_agreement"],
        cached=True,
        runtime=doc["runtime"],
    )


class Optimizer:
    def __init__(self, state_dir: str | Path) -> None:
        self.root = Path(state_dir) / "optimized"

    def command(self, model: ModelSection, out: Path) -> list[str]:
        nice = [shutil.which("nice") or "nice", "-n", "19"]
        # The runtimes the backend setting leaves open: with "auto", every one installed
        # (OpenVINO beside onnxruntime on an x86 CPU), the fastest that passes serves.
        target = {
            "openvino": ["--target", "openvino", "--device", model.openvino.device],
            "onnxruntime": ["--target", "cpu", "--runtime", "onnxruntime"],
        }.get(model.backend, [])
        return [
            *nice,
            sys.executable,
            "-m",
            "mcpd",
            "optimize",
            model.path,
            "--calibration",
            model.calibration,
            "--out",
            str(out),
            "--precision",
            model.optimize,
            "--min-cosine",
            str(model.min_cosine),
            *target,
            "--json",
        ]

    async def build(self, model: ModelSection) -> Built:
        """The cached result for `model`, else a fresh one built by a child process."""
        loop = asyncio.get_running_loop()
        try:
            key = await loop.run_in_executor(None, cache_key, model)
        except OSError as exc:
            raise BuildError(f"cannot read {exc.filename}: {exc.strerror}") from None
        entry = self.root / key
        if (entry / RESULT).is_file():
            try:
                return _read(entry)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("optimized cache %s unreadable (%s); rebuilding", entry, exc)
                shutil.rmtree(entry, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        scratch = self.root / f".{key}.{os.getpid()}.tmp"
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command(model, scratch),
                cwd=self.root,  # not the daemon's folder (onnxruntime's tools may write there)
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await process.communicate()
            except asyncio.CancelledError:  # the daemon stops or the model changed
                process.kill()
                await process.wait()
                raise
            if process.returncode != 0:
                lines = err.decode(errors="replace").strip().splitlines()
                raise BuildError(lines[-1] if lines else f"exit status {process.returncode}")
            (scratch / RESULT).write_bytes(out)
            os.replace(scratch, entry)  # the cache entry appears whole or not at all
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        built = _read(entry)
        return dataclasses.replace(built, cached=False)
