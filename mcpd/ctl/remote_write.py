"""POST a remote-write body to a store, over one kept-alive HTTP connection.

The answer is one of three, as the Remote-Write 1.0 specification's "Retries & Backoff" sorts
them (docs/ingest.md §1): 2xx accepted; 5xx, 429 or no answer at all (a refused connection, a
timeout) failed, to be sent again; any other 4xx rejected, never to be sent again as it is (a
Prometheus answers 400 to a request with one out-of-order sample and writes none of it).
"""

from __future__ import annotations

import base64
import http.client
import urllib.parse
from dataclasses import dataclass
from typing import Literal

from mcpd import __version__
from mcpd.ctl.ingest_batch import CONTENT_TYPE, ENCODING, VERSION

Verdict = Literal["accepted", "failed", "rejected"]


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    detail: str
    """The status and the start of the store's answer, or why there was none."""


def verdict(status: int) -> Verdict:
    if 200 <= status < 300:
        return "accepted"
    if status >= 500 or status == 429:
        return "failed"
    return "rejected"


class RemoteWrite:
    """The store at `url` (http or https; user:password@ in it is sent as basic auth)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL")
        self.url = url
        self._parts = parts
        self._path = parts.path or "/"
        if parts.query:
            self._path += "?" + parts.query
        self._timeout_s = timeout_s
        self._headers = {
            "Content-Type": CONTENT_TYPE,
            "Content-Encoding": ENCODING,
            "X-Prometheus-Remote-Write-Version": VERSION,
            "User-Agent": f"mcpctl-ingest/{__version__}",
        }
        if parts.username is not None:
            credentials = f"{urllib.parse.unquote(parts.username)}:"
            credentials += urllib.parse.unquote(parts.password or "")
            self._headers["Authorization"] = "Basic " + base64.b64encode(
                credentials.encode()
            ).decode("ascii")
        self._connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        kind = (
            http.client.HTTPSConnection
            if self._parts.scheme == "https"
            else http.client.HTTPConnection
        )
        return kind(self._parts.hostname or "", self._parts.port, timeout=self._timeout_s)

    def send(self, body: bytes) -> Outcome:
        if self._connection is None:
            self._connection = self._connect()
        try:
            self._connection.request("POST", self._path, body, self._headers)
            response = self._connection.getresponse()
            answer = response.read(512)
            if response.will_close:
                self.close()
            else:
                response.read()  # the rest, so the connection can carry the next request
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return Outcome("failed", f"{type(exc).__name__}: {exc}")
        text = answer.decode("utf-8", "replace").strip()
        return Outcome(verdict(response.status), f"{response.status} {text}".strip())

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
