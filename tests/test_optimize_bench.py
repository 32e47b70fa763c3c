"""`mcpd bench`: the Pareto frontier (against a brute-force definition), the sweep over real
onnxruntime sessions, its table, JSON and plot, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpd.cli import main
from mcpd.governor.domains import FrequencyDomain, discover
from mcpd.governor.probe import probe
from mcpd.optimize.interface import OptimizeError
from mcpd.optimize.onboard import caps_held
from mcpd.optimize.pareto import Point, frontier
from mcpd.sim import PROFILES, LoadSchedule, Simulator
from sensors import SensorSet
from tests import optimize_models as models


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
    assert main(["bench", *args, "--json", "--plot", str(tmp_path / "sweep.png")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["points"]) == 2 * 2 * 2
    assert {(p["model"], p["batch"], p["threads"]) for p in doc["points"]} == {
        (m, b, t) for m in ("cnn", "cnn.copy") for b in (1, 4) for t in (1, 2)
    }
    for point in doc["points"]:
        assert point["throughput"] > 0 and 0 < point["p50_ms"] <= point["p99_ms"]
        assert point["runs"] >= 5
    marked = [p for p in doc["points"] if p["pareto"]]
    assert len(marked) == len(doc["frontier"]) >= 1
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["bench", str(model), "--batch", "2", "--threads", "1", "--seconds", "0.05"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "model",
        "batch",
        "threads",
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
    assert table[1].split()[:4] == ["cnn", "2", "1", "-"] and table[1].endswith("*")


def test_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = models.cnn(tmp_path / "cnn.onnx")
    sequence = models.transformer(tmp_path / "seq.onnx")  # [N, T, 64]: T is dynamic
    for args, message in (
        ([str(tmp_path / "none.onnx")], "none.onnx: no such model file"),
        ([str(model), "--batch", "0"], "--batch '0': every value must be at least 1"),
        ([str(model), "--threads", "two"], "--threads 'two': expected comma-separated integers"),
        ([str(sequence)], "input x float32 [N,T,64]: only the batch dimension may be dynamic"),
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
