"""mcpd.ctl.paho_thread against paho's own race (eclipse-paho/paho.mqtt.python#872), made certain
rather than waited for: the network thread ends on its own between loop_stop's check and its
join, as it did once in a CI run (tests/support/mqtt_broker.py's recorder, closing)."""

from __future__ import annotations

import threading
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from mcpd.ctl import paho_thread
from tests.support.mqtt_broker import Mosquitto, mosquitto_binary

pytestmark = pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto not installed")


def connected(broker: Mosquitto) -> paho.Client:
    client = paho.Client(CallbackAPIVersion.VERSION2, "race", protocol=paho.MQTTv5)
    up = threading.Event()
    client.on_connect = lambda *_: up.set()
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    assert up.wait(10)
    return client


def thread_ends_first(monkeypatch: pytest.MonkeyPatch, client: paho.Client) -> None:
    """loop_stop asks for the current thread after it has found the network thread running and
    before it joins it: there the client disconnects, and the stopping thread waits until the
    network thread has ended by itself and cleared the client's reference to it."""
    current = threading.current_thread
    stopping = current()

    def late() -> threading.Thread:
        caller = current()
        if caller is stopping:
            monkeypatch.undo()  # once: join asks for the current thread too
            client.disconnect()
            for thread in threading.enumerate():
                if thread.name == "paho-mqtt-client-race":
                    thread.join(10)
        return caller

    monkeypatch.setattr(threading, "current_thread", late)


def test_the_race_is_real_in_paho(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the module: what the CI run saw (so the test below tests something)."""
    with Mosquitto(tmp_path / "broker") as broker:
        client = connected(broker)
        thread_ends_first(monkeypatch, client)
        with pytest.raises(AttributeError, match="join"):
            client.loop_stop()


def test_stopping_while_the_thread_ends_by_itself_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Mosquitto(tmp_path / "broker") as broker:
        client = connected(broker)
        thread_ends_first(monkeypatch, client)
        paho_thread.stop(client)
        assert not any(t.name == "paho-mqtt-client-race" for t in threading.enumerate())
        assert not client.is_connected()
