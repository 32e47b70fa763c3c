"""`[[models]] optimize = ...` in the serving daemon: the original serves at once, `mcpd optimize`
runs as a niced child process, its result is cached under the state directory and swapped in
through the reload path; a failed build is an event and the original serves on. Real sockets,
real onnxruntime sessions, the real optimizer process."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mcpd import config as mcpd_config
from mcpd import status
from mcpd.config import ModelSection
from mcpd.ctl import main as ctl_main
from mcpd.events import Event
from mcpd.optimize.background import BuildError, Built, Optimizer, cache_key
from mcpd.schema import build
from mcpd.serving.backends.openvino import stored_precision
from mcpd.serving.loads import Target
from tests.support import optimize_models as models
from tests.support.mqtt_status import placement
from tests.support.serving_server import Served, config
from tests.support.snapshots import snapshot
from tests.support.waiting import wait_until

DONE = "the optimization done or failed"


def _optimized_event(events: list[Event]) -> Event | None:
    return next((e for e in events if "optimized:" in e.message), None)


def _failed_event(events: list[Event]) -> Event | None:
    return next((e for e in events if e.data.get("state") == "optimize-failed"), None)


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, object]:
    model = models.cnn(tmp_path / "cnn.onnx")
    calibration = models.npy_folder(tmp_path / "cal", models.cnn_samples(8))
    return {
        "name": "cnn",
        "path": str(model),
        "backend": "onnxruntime",  # onnxruntime's build alone (backend "auto" may pick OpenVINO)
        "optimize": "fp32",
        "min_cosine": 0.99,
        "calibration": str(calibration),
    }


@pytest.fixture
def served_factory(tmp_path: Path) -> Iterator[Callable[[dict[str, object]], Served]]:
    running: list[Served] = []

    def make(model: dict[str, object]) -> Served:
        cfg = config(tmp_path, [model], state_dir=str(tmp_path / "state"))
        holder: list[Served] = []

        def board_status() -> dict[str, Any]:
            """The daemon's status document for an idle board with these models' stats."""
            idle = snapshot(ts=1.0, platform="x86", model="test", temperature_c=50.0)
            stats = holder[0].service.stats()
            return status.document(idle, stats, {}, {}, {}, placement=placement())

        served = Served(cfg, status=board_status)
        holder.append(served)
        running.append(served)
        return served

    yield make
    for served in running:
        if not served.loop.is_closed():  # a test may have stopped one itself (a restart)
            served.close()


def _infer(served: Served) -> np.ndarray:
    image = models.cnn_samples(1)[0][np.newaxis]
    with served.client() as client:
        return client.infer("cnn", {"image": image})["scores"]


def test_original_serves_then_the_optimized_model_swaps_in_and_is_cached(
    setup: dict[str, object],
    served_factory: Callable[[dict[str, object]], Served],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    served = served_factory(setup)
    served.wait_settled()
    before = _infer(served)  # the original, while the optimizer runs
    wait_until(lambda: _optimized_event(served.events) or _failed_event(served.events), 240, DONE)
    assert _failed_event(served.events) is None
    stats = served.service.stats()["cnn"]
    summary = stats.detail["optimized"]
    assert isinstance(summary, dict)
    assert summary["precision"] == "fp32" and summary["cosine_min"] >= 0.99
    cache = tmp_path / "state" / "optimized"
    (entry,) = cache.iterdir()
    assert entry.name == cache_key(build(ModelSection, setup))
    assert sorted(f.name for f in entry.iterdir()) == ["cnn.fp32.onnx", "result.json"]
    event = _optimized_event(served.events)
    assert event is not None and "reloaded" in event.message
    assert "optimized: fp32 (onnxruntime)" in event.message
    np.testing.assert_allclose(_infer(served), before, rtol=1e-4, atol=1e-5)
    # Status (and so telemetry) and `mcpctl models` show what serves.
    with served.client() as client:
        assert client.status()["inference"]["cnn"]["optimized"] == summary
    assert ctl_main(["models", "--socket", served.socket]) == 0
    assert "  serving  fp32 (onnxruntime), " in capsys.readouterr().out
    served.close()

    # A restart finds the cache: no optimizer process runs (this one would fail) and the
    # optimized model swaps in again.
    monkeypatch.setattr(Optimizer, "command", lambda self, model, out: ["false"])
    again = served_factory(setup)
    again.wait_settled()
    wait_until(lambda: _optimized_event(again.events) or _failed_event(again.events), 240, DONE)
    assert _failed_event(again.events) is None
    assert again.service.stats()["cnn"].detail["optimized"] == summary


def test_an_openvino_build_is_served_by_the_openvino_backend_with_the_models_options(
    setup: dict[str, object], served_factory: Callable[[dict[str, object]], Served], tmp_path: Path
) -> None:
    import openvino

    model = {**setup, "backend": "openvino", "optimize": "auto", "openvino": {"threads": 1}}
    served = served_factory(model)
    served.wait_settled()
    before = _infer(served)  # the ONNX file through OpenVINO, while the optimizer runs
    wait_until(lambda: _optimized_event(served.events) or _failed_event(served.events), 240, DONE)
    assert _failed_event(served.events) is None
    event = _optimized_event(served.events)
    assert event is not None and "(openvino)" in event.message
    (entry,) = (tmp_path / "state" / "optimized").iterdir()
    result = json.loads((entry / "result.json").read_text())
    ir = entry / Path(result["output"]).name  # the IR pair, and the result that names its runtime
    assert result["runtime"] == "openvino" and ir.suffix == ".xml"
    assert sorted(f.name for f in entry.iterdir()) == [
        ir.with_suffix(".bin").name,
        ir.name,
        "result.json",
    ]
    stored = stored_precision(openvino.Core().read_model(str(ir)))
    with served.client() as client:
        report = client.status()["inference"]["cnn"]
    assert report["optimized"]["runtime"] == "openvino"
    assert report["optimized"]["precision"] == result["precision"]
    # Served by the openvino backend at the precision the build was measured at.
    assert report["openvino"]["device"] == "CPU" and report["openvino"]["precision"] == stored
    assert np.argmax(_infer(served)) == np.argmax(before)


def test_an_openvino_build_of_a_model_onnxruntime_served_keeps_its_threads(
    setup: dict[str, object], tmp_path: Path
) -> None:
    model = build(
        ModelSection, {**setup, "backend": "auto", "onnxruntime": {"intra_op_threads": 3}}
    )
    built = Built(
        tmp_path / "cnn.int8.xml", "int8", 2.0, 0.99, None, cached=True, runtime="openvino"
    )
    source = Target(model, None, built).source()
    assert (source.path, source.backend) == (str(built.path), "openvino")
    assert source.openvino.threads == 3  # the setting the original served with
    assert source.served_by() == "openvino"
    threads = dataclasses.replace(model.openvino, threads=1)
    assert (
        Target(dataclasses.replace(model, openvino=threads), None, built).source().openvino
        == threads
    )
    onnx = dataclasses.replace(built, path=tmp_path / "cnn.int8.onnx", runtime="onnxruntime")
    assert Target(model, None, onnx).source().backend == "auto"


def test_a_failed_build_is_an_event_and_the_original_serves_on(
    setup: dict[str, object], served_factory: Callable[[dict[str, object]], Served], tmp_path: Path
) -> None:
    wrong = models.npy_folder(tmp_path / "wrong", [np.zeros((3, 8, 8), np.float32)] * 3)
    served = served_factory({**setup, "calibration": str(wrong)})
    served.wait_settled()
    wait_until(lambda: _failed_event(served.events), 240, "the optimization's failure")
    event = _failed_event(served.events)
    assert event is not None
    assert "optimization failed, the original serves on" in event.message
    assert "input 'image' has shape 1x3x8x8, the model wants ?x3x32x32" in event.message
    assert _infer(served).shape == (1, 10)
    assert "optimized" not in served.service.stats()["cnn"].detail
    assert not list((tmp_path / "state" / "optimized").iterdir())  # nothing half-written


def test_the_optimizer_runs_niced_in_its_own_process(setup: dict[str, object]) -> None:
    model = build(ModelSection, setup)
    command = Optimizer("/var/lib/mcpd").command(model, Path("/tmp/out"))
    assert command[1:3] == ["-n", "19"] and command[0].endswith("nice")
    assert command[4:6] == ["-m", "mcpd"] and "optimize" in command
    assert command[command.index("--precision") + 1] == "fp32"
    assert command[command.index("--min-cosine") + 1] == "0.99"
    # The backend decides the runtimes measured: onnxruntime's alone here.
    assert command[command.index("--target") :][:4] == [
        "--target",
        "cpu",
        "--runtime",
        "onnxruntime",
    ]
    for backend, measured in (
        ("openvino", ["--target", "openvino", "--device", "CPU"]),
        ("auto", []),  # --target cpu: every runtime installed, the fastest that passes serves
    ):
        command = Optimizer("/var/lib/mcpd").command(
            dataclasses.replace(model, backend=backend), Path("/tmp/out")
        )
        assert command[command.index("0.99") + 1 : -1] == measured


def test_the_cache_key_changes_with_model_samples_and_options(
    setup: dict[str, object], tmp_path: Path
) -> None:
    model = build(ModelSection, setup)
    key = cache_key(model)
    assert cache_key(dataclasses.replace(model, min_cosine=0.95)) != key
    assert cache_key(dataclasses.replace(model, optimize="int8")) != key
    np.save(tmp_path / "cal" / "extra.npy", np.zeros((3, 32, 32), np.float32))
    assert cache_key(model) != key


def test_config_needs_calibration_and_resolves_it_beside_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mcpd.toml"
    path.write_text('[[models]]\nname = "m"\npath = "m.onnx"\noptimize = "int8"\n')
    with pytest.raises(mcpd_config.ConfigError, match="needs calibration"):
        mcpd_config.load(path)
    path.write_text(
        '[[models]]\nname = "m"\npath = "m.onnx"\noptimize = "auto"\ncalibration = "samples"\n'
    )
    (model,) = mcpd_config.load(path).models
    assert model.calibration == str(tmp_path / "samples") and model.min_cosine == 0.98


def test_a_damaged_cache_entry_is_rebuilt_once_and_unused_entries_are_pruned(
    setup: dict[str, object],
    served_factory: Callable[[dict[str, object]], Served],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An emptied cached model was taken as it was: "reload failed" at every restart, never built
    again. Now it is checked against the size and sha256 in result.json, removed and built again;
    a rebuild that fails too is said once (the original serves on), and the next start builds it
    whole. Entries no configured model uses, and scratch folders of builds that are gone, are
    removed at start."""
    first = served_factory(setup)
    wait_until(lambda: _optimized_event(first.events) or _failed_event(first.events), 240, DONE)
    first.close()
    cache = tmp_path / "state" / "optimized"
    (entry,) = cache.iterdir()
    model = entry / "cnn.fp32.onnx"
    model.write_bytes(b"")
    unused, stale = cache / ("0" * 32), cache / ".0123.4194305.tmp"  # a pid above pid_max
    for folder in (unused, stale):
        folder.mkdir()
        (folder / "model.onnx").write_bytes(b"x")

    with monkeypatch.context() as patch:  # the rebuild fails too
        patch.setattr(Optimizer, "command", lambda self, model, out: ["false"])
        again = served_factory(setup)
        states = ("failed", "optimize-failed")
        wait_until(lambda: any(e.data.get("state") in states for e in again.events), 240, "a state")
        assert [e.data.get("state") for e in again.events if e.data.get("model")] == [
            "ready",
            "optimize-failed",
        ]  # no "reload failed" of an empty file
        damaged = [r.message for r in caplog.records if "is damaged" in r.message]
        assert len(damaged) == 1 and "cnn.fp32.onnx has 0 bytes, result.json says" in damaged[0]
        wait_until(lambda: not unused.exists() and not stale.exists(), 240, "the cache pruned")
        assert not entry.exists() and "optimized" not in again.service.stats()["cnn"].detail
        again.close()

    rebuilt = served_factory(setup)
    wait_until(lambda: _optimized_event(rebuilt.events) or _failed_event(rebuilt.events), 240, DONE)
    assert _failed_event(rebuilt.events) is None
    result = json.loads((entry / "result.json").read_text())
    assert result["bytes"] == model.stat().st_size > 0
    assert result["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()


def _entry(tmp_path: Path, model: ModelSection, data: bytes = b"abc") -> Path:
    """A cache entry as a build writes it, for `model`, holding `data` as the optimized model."""
    entry = tmp_path / "state" / "optimized" / cache_key(model)
    entry.mkdir(parents=True)
    (entry / "m.onnx").write_bytes(data)
    result = {
        "output": "/elsewhere/m.onnx",
        "precision": "fp32",
        "speedup": None,
        "accuracy": {"cosine_min": 1.0, "top1_agreement": None},
        "runtime": "onnxruntime",
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (entry / "result.json").write_text(json.dumps(result))
    return entry


DAMAGE: dict[str, tuple[Callable[[Path], object], str]] = {
    "an entry from before the checks": (
        lambda e: (e / "result.json").write_text(
            json.dumps(
                {
                    k: v
                    for k, v in json.loads((e / "result.json").read_text()).items()
                    if k != "sha256"
                }
            )
        ),
        "result.json has no 'sha256'",
    ),
    "a result.json cut short": (
        lambda e: (e / "result.json").write_text('{"output": "m.on'),
        "not JSON",
    ),
    "a result.json nested 100 000 deep": (
        lambda e: (e / "result.json").write_text("[" * 100_000),
        "nested deeper than",
    ),
    "a model changed in place": (
        lambda e: (e / "m.onnx").write_bytes(b"abd"),
        "m.onnx is not the file built (its sha256 differs)",
    ),
    "a model replaced by a link": (
        lambda e: ((e / "m.onnx").unlink(), (e / "m.onnx").symlink_to("/etc/passwd")),
        "Too many levels of symbolic links",
    ),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_cache_entry_is_checked_before_use_and_a_damaged_one_is_removed(
    setup: dict[str, object],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    damage: str,
) -> None:
    model = build(ModelSection, setup)
    optimizer = Optimizer(tmp_path / "state")
    entry = _entry(tmp_path, model)
    built = asyncio.run(optimizer.build(model))
    assert built.cached and built.path == entry / "m.onnx" and built.precision == "fp32"
    spoil, problem = DAMAGE[damage]
    spoil(entry)
    monkeypatch.setattr(Optimizer, "command", lambda self, model, out: ["false"])
    with pytest.raises(BuildError, match="exit status 1"):
        asyncio.run(optimizer.build(model))
    (said,) = [r.message for r in caplog.records if "is damaged" in r.message]
    assert problem in said and not os.path.lexists(entry)


def test_an_openvino_entry_is_checked_with_the_weights_beside_its_xml(
    setup: dict[str, object], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An IR is two files: a changed .bin is damage as a changed .xml is."""
    model = build(ModelSection, setup)
    entry = tmp_path / "state" / "optimized" / cache_key(model)
    entry.mkdir(parents=True)
    (entry / "m.xml").write_bytes(b"<net/>")
    (entry / "m.bin").write_bytes(b"weights")
    result = {
        "output": "m.xml",
        "precision": "bf16",
        "speedup": 2.0,
        "accuracy": {"cosine_min": 0.999, "top1_agreement": 1.0},
        "runtime": "openvino",
        "bytes": 13,
        "sha256": hashlib.sha256(b"<net/>weights").hexdigest(),
    }
    (entry / "result.json").write_text(json.dumps(result))
    optimizer = Optimizer(tmp_path / "state")
    built = asyncio.run(optimizer.build(model))
    assert built.cached and built.runtime == "openvino" and built.path == entry / "m.xml"
    (entry / "m.bin").write_bytes(b"weightz")
    optimizer.command = lambda model, out: ["false"]  # type: ignore[method-assign]
    with pytest.raises(BuildError, match="exit status 1"):
        asyncio.run(optimizer.build(model))
    (said,) = [r.message for r in caplog.records if "is damaged" in r.message]
    assert "m.xml is not the file built (its sha256 differs)" in said
