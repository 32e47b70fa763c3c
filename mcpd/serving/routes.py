"""What a handler answers (Response) and which handler answers a request (Router), for the HTTP
front in mcpd.serving.http: the endpoints are written once against these, whatever serves them.

The router turns every failure into the protocol's {"error": "..."} (docs/serving-protocol.md §1.5):
a RequestError with its status, an unknown path 404, a known path with another method 405, and a
bug in a handler 500 (logged), so nothing a client sends can take the server down.
"""

from __future__ import annotations

import email.utils
import http
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mcpd.serving.errors import RequestError

if TYPE_CHECKING:
    from mcpd.serving.request import Request

log = logging.getLogger("mcpd.serving.http")

JSON = "application/json"
REASONS = {status.value: status.phrase for status in http.HTTPStatus}


@dataclass(frozen=True, slots=True)
class Response:
    status: int = 200
    body: bytes | bytearray = b""
    content_type: str | None = None
    headers: Mapping[str, str] | None = None
    close: bool = False
    """Close the connection after this answer (the rest of the request may be unread)."""

    def head(self, keep_alive: bool) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status} {REASONS.get(self.status, '')}",
            f"Content-Length: {len(self.body)}",
            f"Date: {_date()}",
        ]
        if self.content_type is not None:
            lines.append(f"Content-Type: {self.content_type}")
        if self.headers:
            lines += [f"{name}: {value}" for name, value in self.headers.items()]
        if not keep_alive:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


_dated: tuple[int, str] = (0, "")


def _date() -> str:
    """The Date header (RFC 9110 §6.6.1: an origin server with a clock sends it), once a second."""
    global _dated
    now = int(time.time())
    if _dated[0] != now:
        _dated = (now, email.utils.formatdate(now, usegmt=True))
    return _dated[1]


def reply(document: object, status: int = 200) -> Response:
    return Response(status, json.dumps(document).encode(), JSON)


def error(message: str, status: int, close: bool = False) -> Response:
    return Response(status, json.dumps({"error": message}).encode(), JSON, close=close)


Handler = Callable[["Request"], Awaitable[Response]]

_PARAMETER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    """Literal, with `{name}` standing for one path segment."""
    handler: Handler


def get(path: str, handler: Handler) -> Route:
    return Route("GET", path, handler)


def post(path: str, handler: Handler) -> Route:
    return Route("POST", path, handler)


def _pattern(path: str) -> re.Pattern[str] | None:
    """None for a literal path, compared as it is."""
    if "{" not in path:
        return None
    parts = _PARAMETER.split(path)  # literal, name, literal, name, ..., literal
    regex = "".join(
        re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts)
    )
    return re.compile(f"^{regex}$")


class Router:
    """Routes are tried in order, the first whose path and method match wins (as aiohttp's
    router did, so the order of the table in mcpd.serving.endpoints still decides)."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self._routes = [
            (route.method, _pattern(route.path), route.path, route.handler) for route in routes
        ]

    def match(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        """The handler and the path's parameters; RequestError 404 or 405 when none fits."""
        wanted = "GET" if method == "HEAD" else method
        allowed = False
        for route_method, pattern, literal, handler in self._routes:
            if pattern is None:
                if path != literal:
                    continue
                params: dict[str, str] = {}
            else:
                found = pattern.match(path)
                if found is None:
                    continue
                params = found.groupdict()
            if route_method == wanted:
                return handler, params
            allowed = True
        if allowed:
            raise RequestError(f"Method Not Allowed: {method} {path}", 405)
        raise RequestError(f"Not Found: {method} {path}", 404)

    async def handle(self, request: Request) -> Response:
        try:
            handler, request.params = self.match(request.method, request.path)
            return await handler(request)
        except RequestError as exc:
            # 408, 413: the rest of the body is not read, so nothing else can follow on this
            # connection.
            return error(exc.message, exc.status, close=exc.status in (408, 413))
        except Exception as exc:  # a bug in a handler must not take the daemon down
            log.exception("%s %s failed", request.method, request.path)
            return error(f"internal error: {type(exc).__name__}: {exc}", 500)
