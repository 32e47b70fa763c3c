"""Stopping paho's network thread (`loop_start`) without its race.

paho-mqtt 2.2's `Client.loop_stop()` reads the client's thread, then joins it, and the thread
clears that reference as it ends. A stop that meets the thread ending on its own (the broker
closed the connection, or the DISCONNECT just sent took effect) raises AttributeError from
`None.join()` (eclipse-paho/paho.mqtt.python#872, open). The thread has then run to its end:
nothing is left to join, so the error says nothing the caller must act on. Uncaught, it would
kill `mcpctl ingest`'s broker thread when a broker drops the connection, and the process would go
on waiting for deliveries no one puts in its queue (a test's recorder met it in a CI run).
"""

from __future__ import annotations

from contextlib import suppress

import paho.mqtt.client as paho


def stop(client: paho.Client) -> None:
    """Stop the client's thread and wait for it, if it was still running."""
    with suppress(AttributeError):  # #872: it ended between loop_stop's check and its join
        client.loop_stop()


def close(client: paho.Client) -> None:
    """Send DISCONNECT (if connected) and stop the thread."""
    client.disconnect()
    stop(client)
