"""The retained status is said again every `heartbeat_s`, expiring after three (MQTT 5), so that a
board whose Will never comes (its broker node died with it: tests/telemetry/test_mqtt_cluster.py) stops
reading `online` by itself."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.support.mqtt_broker import Mosquitto, mosquitto_binary, publishing, recording, settings

pytestmark = pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto not installed")

STATUS = "mcpd/b1/status"


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_online_is_said_again_every_heartbeat_expiring_after_three(
    tmp_path: Path, protocol: str
) -> None:
    with Mosquitto(tmp_path / "broker") as broker, recording(broker, STATUS) as recorder:
        mqtt = settings(broker, protocol=protocol, heartbeat_s=1)
        with publishing(mqtt, tmp_path / "board"):
            said = recorder.wait_for(STATUS, 3, timeout=15)
        with recording(broker, STATUS) as late:
            [retained] = late.wait_for(STATUS)
    assert [m.payload for m in said[:3]] == [b"online"] * 3
    gaps = [b.at - a.at for a, b in itertools.pairwise(said[:3])]
    assert all(gap > 0.5 for gap in gaps), gaps  # a heartbeat, not a burst
    expiry = [getattr(m.properties, "MessageExpiryInterval", None) for m in said[:3]]
    content = [getattr(m.properties, "ContentType", None) for m in said[:3]]
    assert expiry == ([3] * 3 if protocol == "5" else [None] * 3)
    assert content == [None] * 3  # a word, not JSON
    # Its own goodbye does not expire: a board stopped on purpose stays `offline`.
    assert retained.payload == b"offline" and retained.retain
    assert getattr(retained.properties, "MessageExpiryInterval", None) is None
