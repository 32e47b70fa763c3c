"""The command topic: a short allow-list of runtime commands, each checked, run and answered.

Request: publish to `<prefix>/<device>/cmd/<name>` an empty payload or a JSON object
`{"id": "…", "args": {…}}` (both keys optional; `id` is echoed). The answer goes to the request's
MQTT 5 Response Topic (with its Correlation Data) when it has one, else to
`<prefix>/<device>/cmd/<name>/reply`: `{"command", "id", "ok": true, "result": {…}}` or
`{"command", "id", "ok": false, "error": "…"}`. Nothing here takes a path, a model file or a shell
command, and nothing outside the allow-list reaches the daemon.

Whatever arrives, the topic costs the governor little. Issue 26: 80 000 malformed requests in 8 s
took it from 30 MB to 600 MB, made its control loop 678 ms late and stopped its telemetry: each
request was parsed, logged and answered, the answers queued in paho without bound, and paho reads
as many packets per call as it holds queued, so each read grew longer and telemetry waited behind
it. Now a flood is not even read (mcpd.telemetry.inbound); requests over RATE_PER_S are dropped
before they are parsed, unanswered; at most ANSWERS_IN_FLIGHT answers wait for the broker, so that
they never take the room telemetry needs; each kind of trouble is logged once per SAY_EVERY_S with
how many went unsaid.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.properties import Properties

from mcpd.config import ProfileName
from mcpd.schema import Invalid, build
from mcpd.telemetry.encoder import dumps
from mcpd.telemetry.inbound import SAY_EVERY_S, TokenBucket
from mcpd.telemetry.mqtt_client import publish_properties
from mcpd.telemetry.topics import Topics
from sensors.episodes import Repeats

log = logging.getLogger("mcpd.telemetry")

Runner = Callable[[str, dict[str, Any]], dict[str, Any]]
MAX_PAYLOAD = 4096
RATE_PER_S = 1.0
"""Requests taken per second on average: people and fleet tools send a few a minute."""
BURST = 10
"""Requests taken at once after a quiet spell."""
ANSWERS_IN_FLIGHT = 10
"""Answers handed to the broker and not yet acknowledged, at most; a request that finds no room
for its answer is dropped before it runs."""


@dataclass(frozen=True)
class NoArgs:
    pass


@dataclass(frozen=True)
class ProfileArgs:
    name: ProfileName
    """A governor profile the daemon knows; it answers with an error for any other."""


COMMANDS: dict[str, type] = {  # the one allow-list; the daemon runs these and no other
    "pause": NoArgs,  # hold the caps where they are
    "resume": NoArgs,
    "profile": ProfileArgs,
}


class Rejected(Exception):
    pass


def _request(payload: bytes) -> tuple[str | int | None, dict[str, Any]]:
    if len(payload) > MAX_PAYLOAD:
        raise Rejected(f"payload too large ({len(payload)} bytes; at most {MAX_PAYLOAD})")
    if not payload.strip():
        return None, {}
    try:
        request = json.loads(payload)
    except ValueError as exc:  # UnicodeDecodeError is one
        raise Rejected(f"payload is not JSON: {exc}") from None
    except RecursionError:  # json's C decoder counts its depth against the recursion limit
        raise Rejected("payload is not JSON: nested too deeply") from None
    if not isinstance(request, dict):
        raise Rejected("payload must be a JSON object")
    unknown = sorted(set(request) - {"id", "args"})
    if unknown:
        raise Rejected(f"unknown keys {', '.join(unknown)}; expected id and args")
    ident = request.get("id")
    valid_id = isinstance(ident, int) and not isinstance(ident, bool)
    if not (ident is None or valid_id or (isinstance(ident, str) and len(ident) <= 64)):
        raise Rejected("id must be an integer or a string of at most 64 characters")
    args = request.get("args", {})
    if not isinstance(args, dict):
        raise Rejected("args must be a JSON object")
    return ident, args


def _validated(name: str, args: dict[str, Any]) -> dict[str, Any]:
    try:
        return dataclasses.asdict(build(COMMANDS[name], args))
    except Invalid as exc:
        raise Rejected("; ".join(f"args.{problem}" for problem in exc.problems)) from None


def answer(
    name: str, payload: bytes, run: Runner, retained: bool = False
) -> tuple[bytes, str | None]:
    """The reply to one request, and why it was refused (None when it ran). Never raises: every
    failure is an answer that says why; a failure of the daemon is logged with its traceback."""
    ident: str | int | None = None
    try:
        if name not in COMMANDS:
            raise Rejected(f"unknown command {name!r}; allowed: {', '.join(sorted(COMMANDS))}")
        ident, args = _request(payload)
        if retained:
            raise Rejected("retained command refused: it would run again at every reconnect")
        result = run(name, _validated(name, args))
        if result.get("ok", True) is False:
            raise Rejected(str(result.get("error", "refused by the daemon")))
    except Rejected as exc:
        reply = {"command": name, "id": ident, "ok": False, "error": str(exc)}
        return dumps(reply), str(exc)
    except Exception as exc:  # admitted requests only: at most RATE_PER_S tracebacks
        log.exception("command %r failed", name)
        return dumps({"command": name, "id": ident, "ok": False, "error": f"failed: {exc}"}), None
    log.info("command %r done", name)
    result = {key: value for key, value in result.items() if key != "ok"}
    return dumps({"command": name, "id": ident, "ok": True, "result": result}), None


@dataclass(frozen=True)
class Reply:
    topic: str
    payload: bytes
    properties: Properties | None


class CommandTopic:
    """The requests on `<p>/<id>/cmd/<name>`, from admission to answer. Owned by the publisher's
    thread, which tells it what became of each answer it sent (`sent`, `acked`, `lost`)."""

    def __init__(self, run: Runner, topics: Topics, v5: bool) -> None:
        self._run = run
        self._topics = topics
        self._v5 = v5
        self._admission = TokenBucket(RATE_PER_S, BURST)
        self._unsaid: Repeats[str] = Repeats(SAY_EVERY_S)
        self._answering: set[int] = set()
        """paho message ids of the answers not yet acknowledged."""

    def request(self, message: paho.MQTTMessage, name: str, now: float) -> Reply | None:
        """Run the request and return its answer, or None when it is dropped unanswered."""
        if not self._admission.take(now):
            self._say("rate", now, f"a request over {RATE_PER_S:g}/s (burst {BURST}) dropped")
            return None
        if len(self._answering) >= ANSWERS_IN_FLIGHT:
            self._say("room", now, "a request dropped: the broker has not taken earlier answers")
            return None
        reply, refused = answer(name, bytes(message.payload), self._run, bool(message.retain))
        if refused is not None:
            self._say("rejected", now, f"command {name!r} rejected: {refused}")
        return self._addressed(message, reply, self._topics.reply(name))

    def sent(self, mid: int | None) -> None:
        if mid is not None:
            self._answering.add(mid)

    def acked(self, mid: int) -> None:
        self._answering.discard(mid)

    def lost(self) -> None:
        """The connection went, and with it every answer still in paho's queue."""
        self._answering.clear()

    def _say(self, key: str, now: float, message: str) -> None:
        unsaid = self._unsaid.say(key, now)
        if unsaid is not None:
            more = f" ({unsaid} more since the last such line)" if unsaid else ""
            log.warning("command topic: %s%s", message, more)

    def _addressed(self, message: paho.MQTTMessage, reply: bytes, default_topic: str) -> Reply:
        """The answer goes to the request's Response Topic, with its Correlation Data (MQTT 5)."""
        request = message.properties if self._v5 else None
        topic = getattr(request, "ResponseTopic", "") or default_topic
        if any(c in topic for c in "+#\0"):
            topic = default_topic  # a wildcard is no place to publish to
        if request is None:
            return Reply(topic, reply, None)
        properties = publish_properties(None)
        correlation = getattr(request, "CorrelationData", None)
        if correlation:
            properties.CorrelationData = correlation
        return Reply(topic, reply, properties)
