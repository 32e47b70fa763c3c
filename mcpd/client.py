"""A small client for mcpd's socket: the Open Inference Protocol over HTTP/1.1 on a Unix socket,
with tensors sent and received in Triton's binary format. Standard library and numpy only.

    from mcpd.client import Client
    with Client() as mcpd:
        scores = mcpd.infer("demo", {"image": image})["scores"]
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from typing import Any

import numpy as np

from mcpd.client_regions import InRegion, Region, Slot
from mcpd.serving.tensors import DTYPES, datatype_of, deserialize_bytes, serialize_bytes

DEFAULT_SOCKET = "/run/mcpd/mcpd.sock"


def default_socket() -> str:
    return os.environ.get("MCPD_SOCKET", DEFAULT_SOCKET)


class ServerError(Exception):
    """mcpd answered with an error: `status` is the HTTP status, `message` the protocol's error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Client:
    """One keep-alive connection; not for use from several threads at once (make one each)."""

    def __init__(self, socket_path: str | None = None, timeout: float = 60.0) -> None:
        self.socket_path = socket_path or default_socket()
        self._connection = _UnixConnection(self.socket_path, timeout)

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> Reply:
        """Send one request; retried once on a fresh connection if the kept-alive one was closed
        by the server (every mcpd request is safe to repeat)."""
        for attempt in (1, 2):
            try:
                self._connection.request(method, path, body, dict(headers or {}))
                response = self._connection.getresponse()
                return Reply(response.status, response.headers, response.read())
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._connection.close()
                if attempt == 2:
                    raise
            except OSError:
                # No socket yet, refused, timed out: leave the connection ready for the next call
                # (http.client would otherwise refuse it with CannotSendRequest).
                self._connection.close()
                raise
        raise AssertionError("unreachable")

    def _json(self, method: str, path: str, body: object = None) -> Any:
        payload = b"" if body is None else json.dumps(body).encode()
        return self.request(method, path, payload).json()

    def _status(self, path: str) -> bool:
        return self.request("GET", path).status == 200

    # -- the protocol ----------------------------------------------------------------------------

    def live(self) -> bool:
        return self._status("/v2/health/live")

    def ready(self) -> bool:
        return self._status("/v2/health/ready")

    def model_ready(self, model: str) -> bool:
        return self._status(f"/v2/models/{model}/ready")

    def server_metadata(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/v2")
        return result

    def model_metadata(self, model: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/v2/models/{model}")
        return result

    def models(self) -> list[dict[str, Any]]:
        """Every configured model with its state (READY, LOADING, UNAVAILABLE) and why (the reason
        of a model a client unloaded is "unloaded")."""
        result: list[dict[str, Any]] = self._json("POST", "/v2/repository/index", {})
        return result

    def load(self, model: str) -> None:
        """Load the configured model again from its file; returns once it serves."""
        self.request("POST", f"/v2/repository/models/{model}/load").checked()

    def unload(self, model: str) -> None:
        self.request("POST", f"/v2/repository/models/{model}/unload").checked()

    def create_region(self, key: str, byte_size: int) -> Region:
        """A shared memory object (/dev/shm/KEY) the daemon can open although it runs as another
        user: mode 0660, in the socket's group (the daemon's; README, "Shared memory")."""
        return Region(key, byte_size, os.stat(self.socket_path).st_gid)

    def register(self, name: str, region: Region, offset: int = 0, byte_size: int = 0) -> None:
        """Register `region` (from `offset`, `byte_size` bytes, all the rest by default)."""
        body = {
            "key": region.key,
            "offset": offset,
            "byte_size": byte_size or region.byte_size - offset,
        }
        payload = json.dumps(body).encode()
        self.request("POST", f"/v2/systemsharedmemory/region/{name}/register", payload).checked()

    def unregister(self, name: str | None = None) -> None:
        """One region, or all of this user's."""
        path = "/v2/systemsharedmemory" + (f"/region/{name}" if name else "") + "/unregister"
        self.request("POST", path).checked()

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/v2/mcpd/status")
        return result

    def metrics(self) -> str:
        return self.request("GET", "/metrics").checked().decode()

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray | InRegion],
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
        output_regions: Mapping[str, Slot] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run `model` on `inputs` (batch dimension first); returns the outputs by name. Text
        inputs (numpy str or bytes arrays) go as BYTES; BYTES outputs come back as object arrays of
        `bytes`, as tritonclient returns them. An input may lie in a registered shared memory
        region (`InRegion`), and outputs named in `output_regions` are written into one instead
        of returned; only the outputs named in `outputs` or `output_regions` are then computed."""
        items: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        for name, value in inputs.items():
            if isinstance(value, InRegion):
                shape, datatype, params = list(value.shape), value.datatype, _placed(value.slot)
            else:
                array = np.ascontiguousarray(value)
                blobs.append(_binary(array))
                shape, params = list(array.shape), {"binary_data_size": len(blobs[-1])}
                datatype = "BYTES" if array.dtype.kind in "USO" else datatype_of(array.dtype)
            items.append({"name": name, "datatype": datatype, "shape": shape, "parameters": params})
        header: dict[str, Any] = {"inputs": items}
        if request_id is not None:
            header["id"] = request_id
        placed = dict(output_regions or {})
        if outputs is None and not placed:
            header["parameters"] = {"binary_data_output": True}
        else:
            names = [*(outputs or ()), *(n for n in placed if n not in (outputs or ()))]
            header["outputs"] = [
                {
                    "name": n,
                    "parameters": _placed(placed[n]) if n in placed else {"binary_data": True},
                }
                for n in names
            ]
        head = json.dumps(header).encode()
        body = b"".join([head, *blobs])
        response = self.request(
            "POST",
            f"/v2/models/{model}/infer",
            body,
            {
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(len(head)),
            },
        )
        return response.outputs()


def _placed(slot: Slot) -> dict[str, Any]:
    return {
        "shared_memory_region": slot.region,
        "shared_memory_byte_size": slot.byte_size,
        "shared_memory_offset": slot.offset,
    }


def _binary(array: np.ndarray) -> bytes:
    """A tensor's bytes in the binary extension's form; text (str, bytes or object arrays of them)
    as a serialized BYTES tensor."""
    if array.dtype.kind in "US":
        array = array.astype(object)
    return serialize_bytes(array) if array.dtype.kind == "O" else array.tobytes()


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Message
    body: bytes

    def checked(self) -> bytes:
        """The body of a 200 reply; otherwise the protocol's error as a ServerError."""
        if self.status == 200:
            return self.body
        try:
            message = str(json.loads(self.body)["error"])
        except (ValueError, KeyError, TypeError):
            message = self.body.decode(errors="replace") or http.client.responses.get(
                self.status, "error"
            )
        raise ServerError(self.status, message)

    def json(self) -> Any:
        return json.loads(self.checked())

    def outputs(self) -> dict[str, np.ndarray]:
        """An inference response's tensors, JSON or binary."""
        body = self.checked()
        length = self.headers.get("Inference-Header-Content-Length")
        split = int(length) if length is not None else len(body)
        header = json.loads(body[:split])
        offset = split
        result = {}
        for output in header["outputs"]:
            dtype = DTYPES[output["datatype"]]
            size = output.get("parameters", {}).get("binary_data_size")
            if size is not None and output["datatype"] == "BYTES":
                array = np.empty(math.prod(output["shape"]), object)
                array[:] = deserialize_bytes(body[offset : offset + int(size)], array.size)
                offset += int(size)
            elif size is not None:
                array = np.frombuffer(body, dtype, int(size) // dtype.itemsize, offset)
                offset += int(size)
            elif "data" in output:
                array = np.array(output["data"], dtype)
            else:
                continue  # written to shared memory
            result[output["name"]] = array.reshape(output["shape"])
        return result
