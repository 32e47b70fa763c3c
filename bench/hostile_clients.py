"""The attackers of bench/hostile.py, each counting what it got back (an HTTP status, "closed",
"not connected: …", "dropped by the server", MQTT replies)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from mcpd.ctl import paho_thread

HEAD = b"POST /v2/models/demo/infer HTTP/1.1\r\nHost: mcpd\r\n"
BIG = 60 * 2**20
SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: mcpd\r\n\r\n"
LOAD = b"POST /v2/repository/models/demo/load HTTP/1.1\r\nHost: mcpd\r\nContent-Length: 0\r\n\r\n"
SPREAD_WIDTH = 4_000_000
"""Values in the answer of the `spread` model (one value in): 16 MB as FP32, ~76 MB as JSON."""
COMMANDS = (
    ("resume", b""),  # valid: governing is not paused, so it changes nothing
    ("reboot", b""),  # not a command
    ("profile", b'{"args": {"name": "../../etc/passwd"}}'),
    ("pause", b"{not json"),
    ("resume", b"x" * 5000),  # over the 4 KiB a command may take
)
"""What the command flood sends in turn: every kind of refusal, and one command that does nothing."""

Address = Path | tuple[str, int]


async def connected(address: Address, outcomes: Counter[str]) -> socket.socket | None:
    """A non-blocking connection to `address` (the Unix socket, or a TCP port); None, counted,
    when the server's backlog is full."""
    loop = asyncio.get_running_loop()
    target = str(address) if isinstance(address, Path) else address
    family = socket.AF_UNIX if isinstance(target, str) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, target)
        sock.getpeername()  # asyncio reports a connect that failed with EAGAIN as done
    except OSError as exc:
        sock.close()
        outcomes[f"not connected: {exc.strerror or type(exc).__name__}"] += 1
        return None
    return sock


async def exchange(address: Address, data: bytes, outcomes: Counter[str]) -> None:
    """Send `data` (as far as the server takes it) and count the status it answers with; raw
    sockets, so that an answer sent before the server closed is read even after a failed send."""
    loop = asyncio.get_running_loop()
    sock = await connected(address, outcomes)
    if sock is None:
        return
    with sock:
        with contextlib.suppress(OSError):  # answered and closed early: read the answer below
            await loop.sock_sendall(sock, data)
        answer = b""
        with contextlib.suppress(OSError):
            while b"\r\n" not in answer and (chunk := await loop.sock_recv(sock, 4096)):
                answer += chunk
        outcomes[answer.split(b" ")[1].decode() if answer.count(b" ") >= 2 else "closed"] += 1


async def repeat(stop: asyncio.Event, make: Callable[..., Awaitable[None]], *args: object) -> None:
    while not stop.is_set():
        await make(*args)


async def slow_header(sock: Path, stop: asyncio.Event, outcomes: Counter[str]) -> None:
    while not stop.is_set():
        await exchange(sock, HEAD[:30], outcomes)  # returns when the server answers or closes


async def never_reading(address: Address, stop: asyncio.Event, outcomes: Counter[str]) -> None:
    """Pipelines scrapes for as long as the server takes them and reads no answer, with the
    smallest receive buffer there is; connects again once the server drops it."""
    loop = asyncio.get_running_loop()
    where = "socket" if isinstance(address, Path) else "metrics port"
    while not stop.is_set():
        sock = await connected(address, outcomes)
        if sock is None:
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            try:
                while True:  # blocks once the server reads no more
                    await loop.sock_sendall(sock, SCRAPE * 256)
            except OSError:
                outcomes[f"{where}: dropped by the server"] += 1


def json_near_limit() -> bytes:
    """A valid batch-2 request whose JSON is just under the default max_json_bytes (256 KiB)."""
    data = ",".join(["0.1234567"] * (2 * 3 * 64 * 64))
    body = (
        '{"inputs": [{"name": "image", "datatype": "FP32", "shape": [2, 3, 64, 64], "data": ['
        + data
        + "]}]}"
    ).encode()
    return HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


def big_bodies() -> tuple[bytes, bytes]:
    json_body = HEAD + f"Content-Length: {BIG}\r\n\r\n".encode() + b"[" + b"0.5," * (BIG // 4 - 1)
    header = b'{"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 3, 64, 64], "parameters": {"binary_data_size": 49152}}]}'
    binary = (
        HEAD
        + f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {BIG}\r\n\r\n".encode()
        + header
        + bytes(BIG - len(header))
    )
    return json_body, binary


def spread_json() -> bytes:
    """A 100-byte request for the `spread` model's whole answer as JSON."""
    inputs = [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0.123456789]}]
    body = json.dumps({"inputs": inputs}).encode()
    return (
        b"POST /v2/models/spread/infer HTTP/1.1\r\nHost: mcpd\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def post(target: str, body: bytes = b"") -> bytes:
    return (
        f"POST {target} HTTP/1.1\r\nHost: mcpd\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


async def shm_tricks(sock: Path, stop: asyncio.Event, outcomes: Counter[str]) -> None:
    key = f"mcpd-bench-hostile-{os.getpid()}"
    obj = Path("/dev/shm") / key
    link = Path("/dev/shm") / f"{key}-link"
    infer = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "FP32",
                    "shape": [1, 3, 64, 64],
                    "parameters": {"shared_memory_region": "h", "shared_memory_byte_size": 49152},
                }
            ]
        }
    ).encode()
    region = "/v2/systemsharedmemory/region"
    link.unlink(missing_ok=True)
    link.symlink_to(obj)
    try:
        while not stop.is_set():
            obj.write_bytes(bytes(49152))
            await exchange(
                sock,
                post(f"{region}/h/register", json.dumps({"key": key, "byte_size": 49152}).encode()),
                outcomes,
            )
            os.truncate(obj, 100)  # shrink it under the daemon
            await exchange(sock, post("/v2/models/demo/infer", infer), outcomes)
            await exchange(sock, post(f"{region}/h/unregister"), outcomes)
            for bad in (f"{key}\u0000x", "../etc/passwd", link.name):
                await exchange(
                    sock,
                    post(f"{region}/b/register", json.dumps({"key": bad, "byte_size": 8}).encode()),
                    outcomes,
                )
    finally:
        obj.unlink(missing_ok=True)
        link.unlink(missing_ok=True)


def command_flood(port: int, base: str, stop: threading.Event, outcomes: Counter[str]) -> None:
    """Publishes COMMANDS in turn to `base`/cmd/… as fast as the broker takes them (QoS 0), and
    counts the daemon's replies."""

    def replied(client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        with contextlib.suppress(ValueError):
            outcomes["replied ok" if json.loads(message.payload).get("ok") else "refused"] += 1

    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.on_message = replied
    client.connect("127.0.0.1", port)
    client.subscribe(f"{base}/cmd/+/reply")
    client.loop_start()
    try:
        while not stop.is_set():
            for name, payload in COMMANDS:
                client.publish(f"{base}/cmd/{name}", payload).wait_for_publish(5)
                outcomes["sent"] += 1
    finally:
        paho_thread.stop(client)
        client.disconnect()
