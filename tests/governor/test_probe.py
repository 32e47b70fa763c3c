"""`mcpd probe` on every simulator profile: platform, governing temperature/power, domains."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnxruntime
import pytest

from mcpd.governor.probe import probe
from mcpd.sim import PROFILES, LoadSchedule, Simulator
from tests.conftest import PROJECT

EXPECTED = {
    # profile: (platform, power source, estimated, domains)
    "jetson-orin-nano": (
        "jetson-orin",
        "board input VDD_IN",
        False,
        ["policy0", "policy4", "17000000.gpu"],
    ),
    "jetson-agx-orin": (
        "jetson-orin",
        "sum of rails (no board input rail)",
        True,
        ["policy0", "policy4", "policy8", "17000000.gpu"],
    ),
    "jetson-nano-jp4": ("jetson-nano", "board input POM_5V_IN", False, ["policy0", "57000000.gpu"]),
    "rk3588": (
        "rk3588",
        "estimate from the device tree's Energy Model (no power meter)",
        True,
        ["policy0", "policy4", "policy6", "fb000000.gpu", "fdab0000.npu"],
    ),
    "x86-intel": (
        "x86-intel",
        "board input psys",
        False,
        ["policy0", "policy1", "policy2", "policy3"],
    ),
    "x86-amd": (
        "x86-amd",
        "sum of RAPL packages (no psys domain)",
        True,
        [f"policy{n}" for n in range(8)],
    ),
    "x86-intel-hybrid": (
        "x86-intel",
        "board input psys",
        False,
        [f"policy{n}" for n in range(20)],
    ),
    "x86-server": (
        "x86-intel",
        "sum of RAPL packages (no psys domain)",
        True,
        [f"policy{n}" for n in range(32)],
    ),
}

# The hottest governing sensor sits this far above the plant's die temperature (profiles.py).
HOTTEST_OFFSET_C = {"jetson-orin-nano": 0.4, "jetson-agx-orin": 0.4}


class SimulatedTime:
    """probe() sleeps between its two samples: let the plant run through that time instead."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.sim.advance(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def test_every_profile_has_an_expectation() -> None:
    assert set(EXPECTED) == set(PROFILES)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_probe_on_simulated_board(tmp_path: Path, profile: str) -> None:
    sim = Simulator(PROFILES[profile], tmp_path / "board", load=LoadSchedule("sustained"))
    sim.build()
    for _ in range(30):
        sim.advance(1.0)
    time = SimulatedTime(sim)
    result = probe(sim.root, sleep=time.sleep, clock=time.clock)
    platform, source, estimated, domain_names = EXPECTED[profile]
    assert result["platform"] == platform
    assert result["power_source"] == source and result["power_estimated"] is estimated
    assert [d["name"] for d in result["domains"]] == domain_names
    for d in result["domains"]:
        assert d["cap_mhz"] == d["max_mhz"] and d["min_mhz"] < d["max_mhz"]
        assert d["available_mhz"] == sorted(d["available_mhz"])
    expected_c = sim.state.die_c + HOTTEST_OFFSET_C.get(profile, 0.0)
    assert result["temperature_c"] == pytest.approx(expected_c, abs=0.6)
    if source.startswith("estimate"):
        # The NPU's node has no coefficient (none configured here): the estimate leaves it out.
        npu_w = sim.state.domain_w[[d.name for d in sim.domains].index("fdab0000.npu")]
        assert [p["source"] for p in result["powers"]] == ["estimate:energy-model"]
        assert result["power_w"] == pytest.approx(sim.state.input_w - npu_w, rel=0.05)
    else:
        packages_only = profile in ("x86-amd", "x86-server")  # no psys: the packages, no board
        plant_w = sim.state.soc_w if packages_only else sim.state.input_w
        assert result["power_w"] == pytest.approx(plant_w, rel=0.02)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_probe_command_json(tmp_path: Path, profile: str) -> None:
    sim = Simulator(PROFILES[profile], tmp_path / "board")
    sim.build()
    out = subprocess.run(
        [sys.executable, "-m", "mcpd", "probe", "--json", "--sysfs-root", str(sim.root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(out.stdout)
    assert set(result) == {
        "platform",
        "model",
        "temperatures",
        "powers",
        "temperature_c",
        "power_w",
        "power_estimated",
        "power_source",
        "domains",
        "execution_providers",
        "gpu_warning",
        "openvino",  # tests/serving/test_openvino_daemon.py checks it
        "cpus",  # tests/placement/test_placement_daemon.py checks them
        "placement",
    }
    assert result["execution_providers"] == onnxruntime.get_available_providers()
    gpu = {"CUDAExecutionProvider", "TensorrtExecutionProvider"}
    jetson_on_cpu = profile.startswith("jetson") and not gpu & set(result["execution_providers"])
    assert (result["gpu_warning"] is not None) is jetson_on_cpu
    assert result["platform"] == EXPECTED[profile][0]
    assert [d["name"] for d in result["domains"]] == EXPECTED[profile][3]
    assert {"name", "source", "celsius", "governs"} == set(result["temperatures"][0])
    assert isinstance(result["temperature_c"], float)
    table = subprocess.run(
        [sys.executable, "-m", "mcpd", "probe", "--sysfs-root", str(sim.root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert table.startswith(f"platform     {EXPECTED[profile][0]}")
    assert f"\nproviders    {', '.join(result['execution_providers'])}\n" in table
    assert ("\nwarning      this jetson" in table) is jetson_on_cpu


def test_probe_of_a_missing_root_fails(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = subprocess.run(
        [sys.executable, "-m", "mcpd", "probe", "--sysfs-root", str(missing)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr == f"mcpd probe: sysfs root {missing}: no such directory\n"
