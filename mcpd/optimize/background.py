"""Optimizing a served model in the background: `mcpd optimize` runs as its own process at the
lowest CPU priority (`nice -n 19`), never in the daemon's, and its result is cached under the state
directory by the model's content hash, the options and the toolchain's versions, so a restart or a
reload reuses it at once.

An entry is written durably (fsynced, renamed into place whole) with the size and sha256 of its
model in result.json, and checked against them before use: a damaged one (an emptied model, a
result.json cut short or from before these checks) is removed and built again, once. At start the
serving process removes the entries no configured model uses (tidy).

A build works in a scratch folder of the cache named after the serving process (`.KEY.PID.tmp`:
its output, and its own temporary files through TMPDIR). It dies with that process (the governor
kills the serving process's group when it exits, mcpd.governor.serving_child), and the next serving
process removes the scratch folders of builders that are gone.

Standard library only: the daemon imports this module, and the optimizer's own imports (onnx,
onnxruntime.quantization) stay in the child process.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import safefs
from mcpd import __version__
from mcpd.config import ModelSection

log = logging.getLogger("mcpd.optimize")

RESULT = "result.json"
RUNTIMES = ("onnxruntime", "openvino")
RESULT_BYTES = 2**20
"""Far above a result.json (the optimizer's --json document, a few KB); a larger one is damage."""
_KEY = re.compile(r"[0-9a-f]{32}")
_SCRATCH = re.compile(r"\.[0-9a-f]+\.(\d+)\.tmp")
"""A build's scratch folder, named after the serving process that started it."""


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


def _model_files(name: str) -> tuple[str, ...]:
    """The files a built model is: an OpenVINO IR is its .xml and the .bin of its weights."""
    return (name, str(Path(name).with_suffix(".bin"))) if name.endswith(".xml") else (name,)


def _digest(folder: int, name: str) -> tuple[int, str]:
    """The size and sha256 of the built model `name` in `folder`, all of its files in order (a
    link is refused)."""
    digest, size = hashlib.sha256(), 0
    for part in _model_files(name):
        fd = os.open(
            part, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder
        )
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise safefs.CorruptFileError(f"{part} is not a regular file")
            while chunk := os.read(fd, 1 << 20):
                digest.update(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    return size, digest.hexdigest()


def _number(value: object, *, optional: bool = False) -> bool:
    if value is None:
        return optional
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _verified(entry: Path, *, cached: bool) -> Built:
    """The result in a cache entry, once its model is checked to be the file that was built.
    Raises CorruptFileError (or OSError) naming what is wrong with it."""
    folder = safefs.open_folder(entry)
    try:
        doc: Any = safefs.read_json(folder, RESULT, RESULT_BYTES)
        if doc is None:
            raise safefs.CorruptFileError(f"no {RESULT}")
        try:
            name, size, sha256 = Path(doc["output"]).name, doc["bytes"], doc["sha256"]
            accuracy = doc["accuracy"]
            built = Built(
                entry / name,
                doc["precision"],
                doc["speedup"],
                accuracy["cosine_min"],
                accuracy["top1_agreement"],
                cached,
                doc["runtime"],
            )
        except (KeyError, TypeError) as exc:
            raise safefs.CorruptFileError(f"{RESULT} has no {exc}") from None
        if not (
            isinstance(size, int)
            and isinstance(sha256, str)
            and built.runtime in RUNTIMES
            and isinstance(built.precision, str)
            and _number(built.speedup, optional=True)
            and _number(built.cosine_min)
            and _number(built.top1_agreement, optional=True)
        ):
            raise safefs.CorruptFileError(f"{RESULT} has a value of the wrong type")
        try:
            found = _digest(folder, name)
        except FileNotFoundError as exc:
            raise safefs.CorruptFileError(f"{exc.filename or name} is missing") from None
        if found[0] != size:
            raise safefs.CorruptFileError(f"{name} has {found[0]} bytes, {RESULT} says {size}")
        if found[1] != sha256:
            raise safefs.CorruptFileError(f"{name} is not the file built (its sha256 differs)")
        return built
    finally:
        os.close(folder)


def _publish(out: Path, entry: Path, report: bytes) -> None:
    """Make the optimizer's output folder the cache entry: result.json beside the model it wrote
    (and fsynced), with that model's size and sha256, then the folder renamed into place whole
    and the rename made durable. Raises BuildError when the report is not what
    `mcpd optimize --json` writes."""
    try:
        doc: Any = safefs.parse_json(report)
        name = Path(doc["output"]).name
    except (ValueError, KeyError, TypeError) as exc:
        raise BuildError(f"the optimizer's report is not usable: {exc}") from None
    folder = safefs.open_folder(out)
    try:
        doc["bytes"], doc["sha256"] = _digest(folder, name)
        safefs.write_file(folder, RESULT, json.dumps(doc, indent=2).encode())
    finally:
        os.close(folder)
    os.replace(out, entry)
    root = safefs.open_folder(entry.parent)
    try:
        os.fsync(root)
    finally:
        os.close(root)


class Optimizer:
    def __init__(self, state_dir: str | Path) -> None:
        self.root = Path(state_dir) / "optimized"

    def tidy(self, models: Iterable[ModelSection]) -> None:
        """Remove the scratch folders of builds whose serving process is gone (killed mid-build:
        a half-written model and the optimizer's temporary files, copies of the model), and the
        entries none of `models` uses (removed, changed, or no longer optimized). When a model's
        key cannot be known (its file missing for now), every entry is kept."""
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        for name in names:
            match = _SCRATCH.fullmatch(name)
            if match is not None and not _alive(int(match[1])):
                log.info("removing %s, left by a build that was stopped", self.root / name)
                _remove(self.root / name)
        try:
            used = {cache_key(model) for model in models if model.optimize != "off"}
        except OSError:
            return
        for name in names:
            if _KEY.fullmatch(name) and name not in used:
                log.info("removing %s: no configured model uses it", self.root / name)
                _remove(self.root / name)

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
        if os.path.lexists(entry):
            try:
                return await loop.run_in_executor(None, lambda: _verified(entry, cached=True))
            except (OSError, ValueError) as exc:
                log.warning(
                    "model %s: the optimized model cached in %s is damaged (%s); building it again",
                    model.name,
                    entry,
                    exc,
                )
                await loop.run_in_executor(None, _remove, entry)
        scratch = self.root / f".{key}.{os.getpid()}.tmp"
        shutil.rmtree(scratch, ignore_errors=True)
        out = scratch / "out"
        (scratch / "tmp").mkdir(parents=True)
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command(model, out),
                cwd=self.root,  # not the daemon's folder (onnxruntime's tools may write there)
                env={**os.environ, "TMPDIR": str(scratch / "tmp")},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                stdout, err = await process.communicate()
            except asyncio.CancelledError:  # the daemon stops or the model changed
                process.kill()
                await process.wait()
                raise
            if process.returncode != 0:
                lines = err.decode(errors="replace").strip().splitlines()
                raise BuildError(lines[-1] if lines else f"exit status {process.returncode}")
            await loop.run_in_executor(None, _publish, out, entry, stdout)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        try:
            return await loop.run_in_executor(None, lambda: _verified(entry, cached=False))
        except (OSError, ValueError) as exc:
            raise BuildError(f"the model just built is damaged: {exc}") from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _remove(path: Path) -> None:
    """Remove a folder and what is in it, or a file or a link in its place (never followed)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
