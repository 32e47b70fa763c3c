"""The one protocol between the governor process and the serving process.

Two channels, each chosen for what crosses it:

- A shared memory block (a memfd the governor creates and both map) for values read on every
  request, with no system call: the batch size per model, and the governor's status document.
  Layout, native byte order:

      magic "MCPDIPC1" (8) | slots u32 | status capacity u32
      batch sizes: slots x i32          (index: the model's slot, see below; 0 = unset)
      status: sequence u64 | length u32 | JSON bytes (status capacity)

  The batch sizes are aligned 4-byte words, which a store writes whole. The status document is
  written under a sequence lock: the sequence is odd while it is being written, and a reader that
  sees it odd, or changed across its read, reads again.

- A socket pair (mcpd.channel) for messages, one JSON object each, of the TypedDicts below:
    governor -> serving  ConfigMessage      at start and at every reload: the whole configuration,
                                            already validated, with the number of the
                                            configurations the governor has sent so far and the
                                            placement plan made for it
    serving -> governor  ConfiguredMessage  the acknowledgement of each configuration (one refused
                                            at start ends that serving process, one refused on
                                            reload leaves the previous one)
                         ReadyMessage       listening, models loading
                         EventMessage       one of its events (a model loaded, a load failed)
                         StatsMessage       its models' statistics, once a second (`statistics`
                                            is null: Triton's counts stay in the serving process)
  What arrives is decoded (decode) against the TypedDict its kind names: a message that is not
  exactly that is refused whole, with an error that names what is wrong, and never reaches the
  receiver, so that a serving process taken over by a client cannot make the governor act on, or
  fail at, what no serving process sends.

A model keeps its slot for the governor's lifetime, so a reload never makes the batcher read
another model's size.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Mapping
from typing import Any, Literal, TypedDict, cast

from mcpd.config import MAX_MODELS
from mcpd.shapes import mismatches
from mcpd.snapshot import ModelStats
from mcpd.status import PlacementDoc, StatusDocument

MAGIC = b"MCPDIPC1"
SLOTS = MAX_MODELS
STATUS_BYTES = 256 * 1024
_HEADER = struct.Struct("=8sII")
_BATCH = struct.Struct("=i")
_STATUS_HEAD = struct.Struct("=QI")
_BATCH_AT = _HEADER.size
_STATUS_AT = _BATCH_AT + SLOTS * _BATCH.size
SIZE = _STATUS_AT + _STATUS_HEAD.size + STATUS_BYTES
_STATUS_TRIES = 10_000
"""Reads of a status document before giving up (a writer takes well under a millisecond; a
governor that died half-way leaves the sequence odd for good, and serving must not spin on it)."""
_STATUS_PARSES = 3
"""Copies that do not parse before giving up: a torn copy parses on the next read, and a block
that never does must not cost thousands of parses of up to STATUS_BYTES on serving's loop."""


class IpcError(Exception):
    pass


class MessageError(IpcError):
    """What arrived is not a message of the protocol; says what is wrong."""


class ConfigMessage(TypedDict):
    kind: Literal["config"]
    generation: int
    config: dict[str, Any]
    """mcpd.config.Config as dataclasses.asdict makes it; serving parses it (mcpd.config.parse)."""
    slots: dict[str, int]
    """Each configured model's slot in the shared block."""
    placement: PlacementDoc
    """Where serving's event loop and each model's threads run (mcpd/placement/plan.py)."""


class ConfiguredMessage(TypedDict):
    kind: Literal["configured"]
    generation: int
    error: str | None
    """Why serving refused the configuration; None when it took it."""


class ReadyMessage(TypedDict):
    kind: Literal["ready"]


class EventFields(TypedDict):
    kind: str
    message: str
    data: dict[str, Any]
    ts: float


class EventMessage(TypedDict):
    kind: Literal["event"]
    event: EventFields


class ModelStatsFields(TypedDict):
    """mcpd.snapshot.ModelStats as it crosses."""

    ready: bool
    requests: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    queue_depth: int
    detail: dict[str, Any]
    statistics: None


class StatsMessage(TypedDict):
    kind: Literal["stats"]
    models: dict[str, ModelStatsFields]


Message = ConfigMessage | ConfiguredMessage | ReadyMessage | EventMessage | StatsMessage
_KINDS: dict[str, Any] = {
    "config": ConfigMessage,
    "configured": ConfiguredMessage,
    "ready": ReadyMessage,
    "event": EventMessage,
    "stats": StatsMessage,
}


def encode(message: Message) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def decode(data: bytes) -> Message:
    """The message in `data`; MessageError when it is not one, naming what is wrong by its path
    from the kind (`stats.models['m'].p50_ms: 'fast' is not float`)."""
    try:
        message = json.loads(data)
    except ValueError as exc:  # UnicodeDecodeError is one
        raise MessageError(f"not JSON ({exc})") from None
    if not isinstance(message, dict):
        raise MessageError(f"not a JSON object but {type(message).__name__}")
    kind = message.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise MessageError(f"no such kind of message: {kind!r}")
    wrong = mismatches(message, _KINDS[kind], kind)
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise MessageError(min(wrong) + more)
    return cast(Message, message)  # checked against its TypedDict


def stats_message(models: Mapping[str, ModelStats]) -> StatsMessage:
    return {
        "kind": "stats",
        "models": {
            name: {
                "ready": stats.ready,
                "requests": stats.requests,
                "errors": stats.errors,
                "p50_ms": stats.p50_ms,
                "p99_ms": stats.p99_ms,
                "queue_depth": stats.queue_depth,
                "detail": dict(stats.detail),
                "statistics": None,
            }
            for name, stats in models.items()
        },
    }


def model_stats(message: StatsMessage) -> dict[str, ModelStats]:
    return {name: ModelStats(**fields) for name, fields in message["models"].items()}


class SharedBlock:
    """The shared memory block: the governor writes, serving reads."""

    def __init__(self, fd: int, *, create: bool) -> None:
        if create:
            os.ftruncate(fd, SIZE)
        self.fd = fd
        self._map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED)
        if create:
            _HEADER.pack_into(self._map, 0, MAGIC, SLOTS, STATUS_BYTES)
        elif _HEADER.unpack_from(self._map, 0) != (MAGIC, SLOTS, STATUS_BYTES):
            raise IpcError("the shared block is not this version's")

    @classmethod
    def create(cls) -> SharedBlock:
        return cls(os.memfd_create("mcpd-ipc", os.MFD_CLOEXEC), create=True)

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)

    # -- batch sizes -----------------------------------------------------------------------------

    def set_batch(self, slot: int, size: int) -> None:
        _BATCH.pack_into(self._map, _BATCH_AT + slot * _BATCH.size, size)

    def batch(self, slot: int) -> int:
        return int(_BATCH.unpack_from(self._map, _BATCH_AT + slot * _BATCH.size)[0])

    # -- the status document ---------------------------------------------------------------------

    def set_status(self, document: StatusDocument) -> None:
        """Publish `document`; one too big for the block (thousands of sensors) keeps every key but
        loses its per-sensor, per-domain and per-model parts, so that readers still get the
        contract's shape."""
        data = json.dumps(document, separators=(",", ":")).encode()
        if len(data) > STATUS_BYTES:
            trimmed: StatusDocument = {
                **document,
                "temperatures": {},
                "powers": {},
                "domains": {},
                "inference": {},
            }
            data = json.dumps(trimmed, separators=(",", ":")).encode()
        sequence = _STATUS_HEAD.unpack_from(self._map, _STATUS_AT)[0]
        _STATUS_HEAD.pack_into(self._map, _STATUS_AT, sequence + 1, 0)  # odd: being written
        start = _STATUS_AT + _STATUS_HEAD.size
        self._map[start : start + len(data)] = data
        _STATUS_HEAD.pack_into(self._map, _STATUS_AT, sequence + 2, len(data))

    def status(self) -> StatusDocument | None:
        """The newest status document; None before the first, or if no whole one could be read.
        The governor wrote it with mcpd.status.document (the same version of mcpd: it starts its
        serving process from its own files), so it is the contract's shape, not checked again.

        A copy that does not parse is read again as if the sequence had moved: Python puts no
        memory barrier between the stores of the data and of the sequence, and on the arm64 boards
        mcpd runs on another core may see them in either order."""
        start = _STATUS_AT + _STATUS_HEAD.size
        unparsed = 0
        for _ in range(_STATUS_TRIES):
            before, length = _STATUS_HEAD.unpack_from(self._map, _STATUS_AT)
            if before % 2 or length > STATUS_BYTES:
                continue
            data = bytes(self._map[start : start + length])
            if _STATUS_HEAD.unpack_from(self._map, _STATUS_AT)[0] != before:
                continue
            if not before:
                return None
            try:
                document: StatusDocument = json.loads(data)
            except ValueError:
                unparsed += 1
                if unparsed == _STATUS_PARSES:
                    return None
                continue
            return document
        return None
