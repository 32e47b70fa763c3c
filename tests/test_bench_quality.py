"""The control-quality benchmark's yardstick (bench/quality.py): what it compares against."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mcpd.governor import domains
from mcpd.sim import PROFILES, Simulator
from tests.conftest import PROJECT

sys.path.insert(0, str(PROJECT / "bench"))
import quality  # bench/quality.py: a script's module, not a package


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_configurations_stay_inside_the_governed_range(profile: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        sim = Simulator(PROFILES[profile], Path(folder) / "board")
        sim.build()
        found = domains.discover(sim.root)
    ranges = quality.governed_ranges(found)
    options = quality.configurations(found)
    assert len(options) >= 3
    for _, caps in options:
        for d in found:
            low, high = ranges[d.name]
            assert low <= caps[d.name] <= high, (d.name, caps[d.name], low, high)
            assert not d.available_mhz or caps[d.name] in d.available_mhz


def test_power_limits_are_feasible_at_the_floor() -> None:
    """AGX Orin's lowest clocks draw more than 12 W (the issue); its limit comes from its 30 W
    power mode, and the lowest configuration meets it."""
    case = quality.Case("jetson-agx-orin", "sustained", minutes=1.0)
    assert case.power_limit_w == 30.0
    lowest = quality.configurations_for(case.profile)[0][1]
    result = quality.run(case, "fixed", lowest)
    assert quality.feasible(result) and isinstance(result["peak_w"], float)
    assert result["peak_w"] > 12.0


def test_one_case_prints_one_json_document() -> None:
    command = [
        sys.executable,
        str(PROJECT / "bench/control_loop.py"),
        "--only",
        "quality",
        "--profile",
        "jetson-nano-jp4",
        "--scenario",
        "bursts-short",
        "--governor",
        "fixed",
        "--cap-fraction",
        "0.6",
        "--sim-minutes",
        "0.5",
        "--json",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    document = json.loads(done.stdout)
    assert set(document) >= {
        "profile",
        "scenario",
        "governor",
        "ambient_c",
        "seed",
        "work",
        "work_by_domain",
        "best_fixed_work",
        "best_fixed_mhz",
        "ratio",
        "peak_c",
        "seconds_above_86",
        "peak_w",
        "seconds_over_power_limit",
        "cap_changes_per_min",
        "joules_per_work",
    }
    assert document["work"] == pytest.approx(sum(document["work_by_domain"].values()), rel=1e-6)
    # fixed 0.6: the CPU at the highest entry <= 0.6 x 1479 MHz inside the clamp, no changes.
    assert document["cap_changes_per_min"] == 0
    assert document["ratio"] is not None and document["ratio"] < 1.0


@pytest.mark.parametrize("start", [0, 6, 13])
def test_a_search_started_from_another_seed_finds_what_bisection_finds(start: int) -> None:
    """Seeds 1 and 2 start at seed 0's best fixed cap and walk to its neighbours: wherever they
    start, the answer is the configuration bisection finds (feasible, the next one up not)."""
    case = quality.Case("rk3588", "sustained", 40.0, minutes=1.0)
    bisected = quality.best_fixed(case)
    walked = quality.best_fixed(case, start)
    assert "infeasible" not in bisected
    assert walked["caps_mhz"] == bisected["caps_mhz"]
    assert walked["result"] == bisected["result"]
    index = quality.start_index(case.profile, walked)
    assert 0 < index < len(quality.configurations_for(case.profile)) - 1


def test_a_trace_lists_each_cap_change_when_and_why() -> None:
    """The AGX Orin under full load at its top clocks draws over its 30 W mode: the first change
    is a cut for power within the first second, and the trace holds as many changes as the count."""
    case = quality.Case("jetson-agx-orin", "sustained", minutes=0.5)
    result = quality.run(case, "adaptive", trace=True)
    trace = result["trace"]
    assert isinstance(trace, list) and trace
    assert len(trace) == round(result["cap_changes_per_min"] * case.minutes)
    first = trace[0]
    assert first["action"] == "lower" and first["t"] < 1.0
    assert first["reason"].startswith("power") and first["power_w"] >= 0.995 * 30.0
    assert first["caps_mhz"] and all(mhz > 0 for mhz in first["caps_mhz"].values())
    assert [change["t"] for change in trace] == sorted(change["t"] for change in trace)
    assert "trace" not in quality.run(case, "adaptive")
