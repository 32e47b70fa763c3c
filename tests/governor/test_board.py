from __future__ import annotations

import pytest

from mcpd.governor import board
from tests.support.fakesys import FakeSysfs


@pytest.mark.parametrize(
    ("compatible", "platform"),
    [
        (("nvidia,p3768-0000+p3767-0005", "nvidia,tegra234"), "jetson-orin"),
        (("nvidia,p3509-0000+p3668-0001", "nvidia,tegra194"), "jetson-xavier"),
        (("nvidia,p3450-0000", "nvidia,jetson-nano", "nvidia,tegra210"), "jetson-nano"),
        (("radxa,rock-5b", "rockchip,rk3588"), "rk3588"),
        (("xunlong,orangepi-5", "rockchip,rk3588s"), "rk3588"),
        (("raspberrypi,5-model-b", "brcm,bcm2712"), "unknown"),
    ],
)
def test_platform_from_device_tree(
    fake: FakeSysfs, compatible: tuple[str, ...], platform: str
) -> None:
    fake.device_tree(compatible, "Some Board")
    fake.cpuinfo(None)
    detected = board.detect(fake.root)
    assert detected.platform == platform
    assert detected.model == "Some Board"


@pytest.mark.parametrize(
    ("vendor", "platform"),
    [("GenuineIntel", "x86-intel"), ("AuthenticAMD", "x86-amd"), ("HygonGenuine", "unknown")],
)
def test_platform_from_cpu_vendor(fake: FakeSysfs, vendor: str, platform: str) -> None:
    fake.cpuinfo(vendor)
    assert board.detect(fake.root).platform == platform


def test_nothing_readable_is_unknown(fake: FakeSysfs) -> None:
    assert board.detect(fake.root) == board.Board("unknown")


def test_l4t_release_parsing() -> None:
    assert (
        board.parse_l4t("# R36 (release), REVISION: 4.7, GCID: 42132812, BOARD: generic\n")
        == "R36.4.7"
    )
    assert board.parse_l4t("# R32 (release), REVISION: 7.4\n") == "R32.7.4"
    assert board.parse_l4t("# R35 (release)\n") == "R35"
    assert board.parse_l4t("garbage") is None


def test_x86_model_from_dmi(fake: FakeSysfs) -> None:
    fake.cpuinfo("GenuineIntel")
    fake.values("sys/class/dmi/id", {"sys_vendor": "LENOVO", "product_name": "20XW0055GE"})
    assert board.detect(fake.root).model == "LENOVO 20XW0055GE"
