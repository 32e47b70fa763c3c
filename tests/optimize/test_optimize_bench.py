"""`mcpd bench`: the Pareto frontier (against a brute-force definition), the sweep over real
onnxruntime sessions and real OpenVINO compiled models (precisions, streams; bf16 not applicable
where the CPU lacks it), its table, JSON and plot, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpd.cli import main
from mcpd.governor.domains import FrequencyDomain, discover
from mcpd.governor.probe import probe
from mcpd.optimize import runners
from mcpd.optimize.interface import OptimizeError
from mcpd.optimize.onboard import caps_held
from mcpd.optimize.pareto import Point, frontier
from mcpd.optimize.runners import Setting
from mcpd.serving.backends import openvino
from mcpd.sim import PROFILES, LoadSchedule, Simulator
from sensors import SensorSet
from tests.support import optimize_models as models
from tests.support.serving_models import ir


def _dominated(p: Point, points: list[Point]) -> bool:
    return any(
        q.latency_ms <= p.latency_ms
        and q.throughput >= p.throughput
        and (q.latency_ms, q.throughput) != (p.latency_ms, p.throughput)
        for q in points
    )


@given(
    st.lists(
        st.tuples(st.integers(1, 50), st.integers(1, 50)).map(
            lambda t: Point(f"{t}", float(t[0]), float(t[1]))
        ),
        max_size=40,
    )
)
def test_frontier_is_exactly_the_undominated_points(points: list[Point]) -> None:
    optimal = frontier(points)
    undominated = {(p.latency_ms, p.throughput) for p in points if not _dominated(p, points)}
    assert {(p.latency_ms, p.throughput) for p in optimal} == undominated
    assert [p.latency_ms for p in optimal] == sorted(p.latency_ms for p in optimal)
    assert len(optimal) == len({(p.latency_ms, p.throughput) for p in optimal})


def test_frontier_example() -> None:
    points = [
        Point("a", 1.0, 100.0),
        Point("b", 2.0, 90.0),  # slower and fewer items/s than a
        Point("c", 4.0, 300.0),
        Point("d", 4.0, 200.0),  # same latency as c, less throughput
        Point("e", 8.0, 310.0),
    ]
    assert [p.label for p in frontier(points)] == ["a", "c", "e"]


def test_sweep_table_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = models.cnn(tmp_path / "cnn.onnx")
    copy = tmp_path / "cnn.copy.onnx"
    copy.write_bytes(model.read_bytes())
    args = [str(model), str(copy), "--batch", "1,4", "--threads", "1,2", "--seconds", "0.05"]
    args += ["--runtime", "onnxruntime"]
    assert main(["bench", *args, "--json", "--plot", str(tmp_path / "sweep.png")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["points"]) == 2 * 2 * 2
    assert {(p["model"], p["batch"], p["threads"]) for p in doc["points"]} == {
        (m, b, t) for m in ("cnn.onnx", "cnn.copy.onnx") for b in (1, 4) for t in (1, 2)
    }
    for point in doc["points"]:
        assert point["throughput"] > 0 and 0 < point["p50_ms"] <= point["p99_ms"]
        assert point["runs"] >= 5
        assert (point["runtime"], point["precision"], point["streams"]) == ("onnxruntime", None, 1)
    marked = [p for p in doc["points"] if p["pareto"]]
    assert len(marked) == len(doc["frontier"]) >= 1
    assert doc["cpu_flags"] == runners.cpu_flags(Path("/proc/cpuinfo").read_text())
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    args = [str(model), "--batch", "2", "--threads", "1", "--seconds", "0.05"]
    assert main(["bench", *args, "--runtime", "onnxruntime"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "cpu flags: " + " ".join(doc["cpu_flags"])
    assert table[1].split() == [
        "model",
        "runtime",
        "prec",
        "batch",
        "threads",
        "streams",
        "caps",
        "items/s",
        "p50",
        "ms",
        "p99",
        "ms",
        "W",
        "mJ/item",
        "pareto",
    ]
    assert table[2].split()[:7] == ["cnn.onnx", "onnxruntime", "-", "2", "1", "1", "-"]
    assert table[2].endswith("*")


def test_openvino_rows_by_precision_and_streams_beside_onnxruntimes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = models.cnn(tmp_path / "cnn.onnx")
    ir(model)
    args = ["--batch", "2", "--threads", "1,2", "--streams", "1,2", "--seconds", "0.05", "--json"]
    assert main(["bench", str(model), str(tmp_path / "cnn.xml"), *args]) == 0
    doc = json.loads(capsys.readouterr().out)
    bf16 = "BF16" in openvino.capabilities("CPU")
    precisions = ["f32", "bf16"] if bf16 else ["f32"]
    expected = [("cnn.onnx", "onnxruntime", None, t, 1) for t in (1, 2)]
    for name in ("cnn.onnx", "cnn.xml"):
        expected += [(name, "openvino", p, 1, 1) for p in precisions]
        expected += [(name, "openvino", p, 2, n) for p in precisions for n in (1, 2)]
    keys = ("model", "runtime", "precision", "threads", "streams")
    assert sorted(tuple(p[k] for k in keys) for p in doc["points"]) == sorted(expected, key=str)
    for point in doc["points"]:
        assert point["runs"] >= 5 * point["streams"] and point["throughput"] > 0
    assert [s["precision"] for s in doc["not_applicable"]] == ([] if bf16 else ["bf16"])


def test_bf16_on_a_cpu_without_it_is_not_applicable_never_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, skipped = runners.plan(["openvino"], [1, 2], ["f32", "bf16"], [1, 2], ["FP32"])
    assert settings == [
        Setting("openvino", 1, "f32", 1),
        Setting("openvino", 2, "f32", 1),
        Setting("openvino", 2, "f32", 2),
    ]
    assert [(s.runtime, s.precision) for s in skipped] == [("openvino", "bf16")]
    reason = "the CPU has no BF16 in OpenVINO's OPTIMIZATION_CAPABILITIES (FP32, INT8)"
    # As OpenVINO reports a CPU without AMX or AVX512-BF16 (an AVX2 Core, most AMD CPUs):
    monkeypatch.setattr(runners, "openvino_capabilities", lambda: ["FP32", "INT8"])
    model = models.cnn(tmp_path / "cnn.onnx")
    args = ["--batch", "1", "--threads", "1", "--seconds", "0.05", "--runtime", "openvino"]
    assert main(["bench", str(model), *args]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in table[2:-1]] == ["f32"]
    assert table[-1] == f"openvino bf16: not applicable: {reason}; bf16 needs AMX or AVX512-BF16"


def test_cpu_flags_are_read_from_cpuinfo() -> None:
    cpuinfo = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 avx_vnni sse\n\nflags : x\n"
    assert runners.cpu_flags(cpuinfo) == ["avx2", "avx512f", "avx_vnni", "amx_bf16"]
    assert runners.cpu_flags("") == []


def test_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = models.cnn(tmp_path / "cnn.onnx")
    sequence = models.transformer(tmp_path / "seq.onnx")  # [N, T, 64]: T is dynamic
    for args, message in (
        ([str(tmp_path / "none.onnx")], "none.onnx: no such model file"),
        ([str(model), "--batch", "0"], "--batch '0': every value must be at least 1"),
        ([str(model), "--threads", "two"], "--threads 'two': expected comma-separated integers"),
        ([str(sequence)], "input x float32 [N,T,64]: only the batch dimension may be dynamic"),
        (
            [str(model), "--runtime", "tvm"],
            "--runtime 'tvm': 'tvm' is not one of onnxruntime, openvino",
        ),
        (
            [str(model), "--precision", "int8"],
            "--precision 'int8': 'int8' is not one of auto, f32, bf16, f16",
        ),
        (
            [str(ir(model)), "--runtime", "onnxruntime"],
            "no runtime of onnxruntime reads an .xml file",
        ),
        ([str(tmp_path / "none.xml")], "none.xml: no such model file"),
    ):
        assert main(["bench", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"mcpd bench: {message}"] or (len(err) == 1 and message in err[0]), err


def board(tmp_path: Path) -> Path:
    """A simulated Orin Nano (a VDD_IN meter, cpufreq and devfreq caps), warmed up and then
    left still, so that its meter reads the same all through the sweep."""
    sim = Simulator(
        PROFILES["jetson-orin-nano"], tmp_path / "board", load=LoadSchedule("sustained")
    )
    sim.build()
    for _ in range(5):
        sim.advance(1.0)
    return sim.root


def caps(found: list[FrequencyDomain]) -> dict[str, str | None]:
    return {d.name: d.read_cap_text() for d in found}


def test_caps_are_held_then_put_back(tmp_path: Path) -> None:
    root = board(tmp_path)
    found = discover(root)
    before = caps(found)
    with caps_held(found, 0.5) as held:
        for domain in found:
            in_force = domain.read_cap_mhz()
            assert in_force == held[domain.name] <= 0.5 * domain.max_mhz or (
                in_force == min(domain.available_mhz)  # no table entry at or below half
            )
            assert in_force is not None and in_force < domain.max_mhz
    assert caps(found) == before
    with pytest.raises(RuntimeError), caps_held(found, 0.7):
        raise RuntimeError("the measurement failed")
    assert caps(found) == before


def test_caps_sweep_reports_board_power_and_energy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = board(tmp_path)
    watts = probe(root, sleep=lambda _: None)["power_w"]
    assert watts is not None and watts > 1
    found = discover(root)
    before = caps(found)
    model = models.cnn(tmp_path / "cnn.onnx")
    args = ["--batch", "1", "--threads", "1", "--seconds", "0.3", "--sysfs-root", str(root)]
    args += ["--runtime", "onnxruntime"]
    assert main(["bench", str(model), *args, "--caps", "1,0.6", "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert [p["cap_fraction"] for p in doc["points"]] == [1.0, 0.6]
    for point in doc["points"]:
        assert point["watts"] == pytest.approx(watts, abs=0.01)
        assert point["power_estimated"] is False
        assert point["joules_per_item"] == pytest.approx(watts / point["throughput"], rel=0.01)
    assert "caps 0.6: policy0 " in out.err
    assert caps(found) == before


def test_caps_sweep_stops_on_a_hot_board_and_puts_caps_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = board(tmp_path)
    found = discover(root)
    before = caps(found)
    for sensor in SensorSet.discover(root).temperatures:
        Path(sensor.attr.path).write_text("86500\n")
    model = models.cnn(tmp_path / "cnn.onnx")
    args = ["--batch", "1", "--threads", "1", "--seconds", "2", "--sysfs-root", str(root)]
    args += ["--runtime", "onnxruntime"]
    assert main(["bench", str(model), *args, "--caps", "0.8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        err
        == "mcpd bench: stopped: the board reached 85 °C (--max-temp) with caps held; caps put back"
    )
    assert caps(found) == before


def test_caps_that_cannot_be_written_are_refused_whole(tmp_path: Path) -> None:
    root = board(tmp_path)
    found = discover(root)
    before = caps(found)
    last = found[-1].cap_path
    last.unlink()
    last.symlink_to(tmp_path / "elsewhere")
    with (
        pytest.raises(OptimizeError, match="--caps: cannot read the cap of"),
        caps_held(found, 0.5),
    ):
        pass
    assert {n: t for n, t in caps(found).items() if n != found[-1].name} == {
        n: t for n, t in before.items() if n != found[-1].name
    }
