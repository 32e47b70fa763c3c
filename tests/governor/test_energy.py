"""Energy per inference per model: the attribution, the loop's energy integral, and where the
figure appears (status document, the serving process's copy, `mcpctl models`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from mcpd import status
from mcpd.ctl import main
from mcpd.governor.energy import IDLE_S, WINDOW_S, EnergyAccount, Served
from mcpd.snapshot import ModelStats
from tests.support.fakesys import FakeSysfs
from tests.support.loop import board_with_meter, make_loop, run_for, set_power
from tests.support.mqtt_status import placement
from tests.support.serving_models import scale
from tests.support.serving_server import Served as Server
from tests.support.serving_server import config, status_document


def test_energy_is_split_by_inference_time_and_idle_energy_is_nobodys() -> None:
    account = EnergyAccount()
    account.update(0.0, 0.0, {"a": Served(0, None), "b": Served(0, None)})
    # 10 J in 1 s: a ran 10 × 2 ms, b 5 × 4 ms: equal busy time, equal energy.
    account.update(10.0, 1.0, {"a": Served(10, 2.0), "b": Served(5, 4.0)})
    per = account.joules_per_inference()
    assert per["a"] == pytest.approx(0.5) and per["b"] == pytest.approx(1.0)
    # No new request for longer than IDLE_S: that energy is charged to nobody.
    account.update(50.0, 1.0 + IDLE_S + 0.5, {"a": Served(10, 2.0), "b": Served(5, 4.0)})
    assert account.joules_per_inference() == per
    account.update(52.0, 2.0 + IDLE_S + 0.5, {"a": Served(12, 2.0), "b": Served(5, 4.0)})
    decay = math.exp(-1.0 / WINDOW_S)
    assert account.joules_per_inference()["a"] == pytest.approx(
        (5.0 * decay + 2.0) / (10 * decay + 2)
    )


def test_unknown_power_or_a_restarted_server_charges_nothing() -> None:
    account = EnergyAccount()
    account.update(None, 0.0, {"a": Served(0, None)})
    account.update(None, 1.0, {"a": Served(5, 1.0)})
    assert account.joules_per_inference() == {}
    account.update(0.0, 2.0, {"a": Served(5, 1.0)})
    account.update(4.0, 3.0, {"a": Served(1, 1.0)})  # counts restarted: nothing to charge
    assert account.joules_per_inference() == {}
    account.update(6.0, 4.0, {"a": Served(3, 1.0)})
    assert account.joules_per_inference() == {"a": pytest.approx(1.0)}


def test_the_loop_integrates_board_energy(fake: FakeSysfs) -> None:
    board_with_meter(fake, 60.0, 5.0)
    loop, clock, _ = make_loop(fake.root)
    run_for(loop, clock, 2.0)
    set_power(fake, 10.0)
    run_for(loop, clock, 2.0)
    # 2 s at 5 W then 2 s at 10 W, give or take one 100 ms sample at the edges.
    assert loop.snapshot.energy_j == pytest.approx(30.0, abs=1.1)


def test_the_status_document_carries_joules_per_inference() -> None:
    from tests.support.snapshots import snapshot

    stats = {"m": ModelStats(True, requests=3), "n": ModelStats(True)}
    document = status.document(
        snapshot(), stats, {}, {}, {}, {"m": 0.123456}, placement=placement()
    )
    assert document["inference"]["m"]["joules_per_inference"] == 0.1235
    assert document["inference"]["n"]["joules_per_inference"] is None


def test_mcpctl_models_shows_energy_per_inference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def estimated() -> dict[str, Any]:
        inference = {"m": {"ready": True, "requests": 7, "joules_per_inference": 0.0123}}
        return {**status_document(), "power_source": "estimate", "inference": inference}

    server = Server(config(tmp_path, [{"name": "m", "path": str(scale(tmp_path / "m.onnx"))}]),
                    status=estimated)  # fmt: skip
    try:
        server.wait_settled()
        assert main(["models", "--socket", server.socket]) == 0
        assert "  energy   0.0123 J per inference (power estimated)\n" in capsys.readouterr().out
        assert main(["models", "--socket", server.socket, "--json"]) == 0
        assert '"joules_per_inference": 0.0123' in capsys.readouterr().out
    finally:
        server.close()
