"""The HTTP/1.1 server of the serving process: an asyncio protocol around httptools (llhttp, the
parser uvicorn uses), for the Unix socket and the `[serving] http` and `[metrics] listen` ports.
What it relies on of httptools and of HTTP/1.1 is in docs/serving-protocol.md §7.

It replaced aiohttp because aiohttp's request and response handling was most of what the event
loop spent per request (BENCHMARKS.md, "Where a served request's time goes"), CPU taken from the
model on a small board. It does what mcpd needs and no more: keep-alive (and pipelined requests,
answered in order), bodies by Content-Length or chunked, `Expect: 100-continue`, and the limits of
the hardening (issue 11): the header timeout from connecting or from the last answer until a
request's header is complete, a bound on the header's size, and bodies that are read only as far
as a handler asks for them (mcpd.serving.limits applies the body limits, budget and timeout).
An answer sent before its request's body was read (413, 408) closes the connection after reading
and dropping what the client still sends for up to `linger_s`, so that the client can read it.

While a client does not read its answers (the transport pauses writing), no further pipelined
request is answered and none is read, so what a connection buffers is bounded: the transport's
high-water mark and one answer, and the requests of one read (issue 26: every pipelined request
used to be answered into the buffer). mcpd.serving.sending holds those unsent bytes against
max_inflight_bytes and drops a client that takes none of them for send_timeout_s.

The connection is read into a buffer of its own (asyncio.BufferedProtocol), and the parser sees
the bytes up to the end of each request's head; a body of known length then bypasses it, into the
request's own buffer (mcpd.serving.request), and a new parser takes the next request. Chunked
bodies, and whatever follows a head split across reads, go through the parser.
"""

from __future__ import annotations

import asyncio
import collections
import urllib.parse
from typing import cast

import httptools

from mcpd.serving.limits import Bodies
from mcpd.serving.request import Request
from mcpd.serving.routes import Response, Router, error
from mcpd.serving.sending import Sending

MAX_HEADER_BYTES = 32768
"""The request line and header fields together; tritonclient's are a few hundred bytes."""
READ_BYTES = 16384
"""What one read of a connection takes at most, but for the rest of a body received in place: a
head, or a small request whole; each connection holds a buffer of this size (4 MiB for the
default 256 connections)."""
END_OF_HEAD = b"\r\n\r\n"


class HttpServer:
    """The connections of one router; the protocol factory for mcpd.serving.connections."""

    def __init__(
        self,
        router: Router,
        header_timeout_s: float,
        linger_s: float,
        send_timeout_s: float,
        bodies: Bodies,
    ) -> None:
        self.router = router
        self.header_timeout_s = header_timeout_s
        self.linger_s = linger_s
        self.send_timeout_s = send_timeout_s
        self.bodies = bodies
        """Where unsent answers are held, with request bodies."""
        self.connections: set[HttpProtocol] = set()
        self.closing = False
        self.send_timeouts = 0
        """Connections dropped because their client took nothing for send_timeout_s."""

    def send_timed_out(self) -> int:
        self.send_timeouts += 1
        return self.send_timeouts

    def __call__(self) -> HttpProtocol:
        return HttpProtocol(self)

    async def shutdown(self, timeout_s: float) -> None:
        """Take no more requests; let those being answered finish for up to `timeout_s`."""
        self.closing = True
        for connection in list(self.connections):
            connection.close_if_idle()
        busy = [c.task for c in self.connections if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=timeout_s)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()


class HttpProtocol(asyncio.BufferedProtocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.receiving: Request | None = None
        """The request whose head or body the parser is reading."""
        self.task: asyncio.Task[None] | None = None
        """Answering the request at the front of the pipeline."""
        self.pipeline: collections.deque[Request] = collections.deque()
        self._url = b""
        self._headers: dict[str, str] = {}
        self._header_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._paused: set[str] = set()
        self._closed = False
        self._stopped = False
        """Nothing more that was received is parsed (a malformed request, or closing)."""
        self._buffer = bytearray(READ_BYTES)
        self._view = memoryview(self._buffer)
        self._direct: Request | None = None
        """The request whose Content-Length body is being received without the parser."""
        self.sending = Sending(server.send_timeout_s, server.bodies, server.send_timed_out)

    # -- asyncio ---------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not asyncio's class
        self.sending.transport = self.transport
        self.server.connections.add(self)
        self._expect_header(self.server.header_timeout_s)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._direct is not None:
            space = self._direct.space()
            if space is not None:
                return space
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        direct = self._direct
        if direct is not None and direct.space() is not None:
            direct.filled(nbytes)
            if not direct.left:
                self._direct_done()
            return
        self._received(self._buffer, nbytes)

    def data_received(self, data: bytes) -> None:
        """For an event loop that does not read into get_buffer() (uvloop, through the
        connection counter's wrapper)."""
        self._received(data, len(data))

    def _received(self, data: bytes | bytearray, nbytes: int) -> None:
        view = memoryview(data)
        start = 0
        while start < nbytes and not self._stopped:
            direct = self._direct
            if direct is not None:
                taken = min(direct.left, nbytes - start)
                direct.received(view[start : start + taken])
                start += taken
                if not direct.left:
                    self._direct_done()
                continue
            # Up to the end of a head, where a body may begin; all of it inside a chunked body.
            end = data.find(END_OF_HEAD, start, nbytes) if self.receiving is None else -1
            stop = nbytes if end < 0 else end + len(END_OF_HEAD)
            self._parse(view[start:stop])
            start = stop
            receiving = self.receiving
            if receiving is not None and receiving.content_length is not None:
                self._direct = receiving

    def _direct_done(self) -> None:
        # The parser still waits for the body it did not see: the next request gets a new one.
        self._direct = None
        self.parser = httptools.HttpRequestParser(self)
        self.on_message_complete()

    def _parse(self, data: memoryview) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._last_request()  # answered as plain HTTP/1.1; what follows is not HTTP
        except httptools.HttpParserError as exc:
            self._stopped = True  # the parser cannot go on: nothing more is read
            self.pause("broken")
            if self.receiving is not None:
                if self.receiving.discard:  # lingering after an early answer
                    self._close()
                    return
                self.receiving.broken(str(exc))  # a body: its reader answers 400
            if self.pipeline:
                while len(self.pipeline) > 1:
                    self.pipeline.pop()
                self._last_request()
                return
            too_large = self._header_bytes > MAX_HEADER_BYTES
            message = f"request header over {MAX_HEADER_BYTES} bytes" if too_large else str(exc)
            self._send(error(f"Bad Request: {message}", 431 if too_large else 400), head=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)
        self._cancel_timer()
        if self.task is not None:
            self.task.cancel()  # the handler takes its request out of the model's queue
        self.transport = None
        self.sending.lost()

    def pause_writing(self) -> None:
        self.pause("writing")  # a client that does not read gets no further answers

    def resume_writing(self) -> None:
        self.sending.look()
        self.resume("writing")
        self._answer_next()

    # -- httptools -------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url, self._headers, self._header_bytes = b"", {}, 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        key = name.decode("latin-1").lower()
        text = value.decode("utf-8", "surrogateescape")
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        self._cancel_timer()
        path = httptools.parse_url(self._url).path.decode("latin-1")
        if "%" in path:
            path = urllib.parse.unquote(path)
        request = Request(
            self,
            self.parser.get_method().decode("ascii"),
            path,
            self._headers,
            bool(self.parser.should_keep_alive()) and not self.server.closing,
        )
        self.receiving = request
        self.pipeline.append(request)
        if len(self.pipeline) > 1:
            self.pause("pipeline")
        self._answer_next()

    def on_body(self, data: bytes) -> None:
        assert self.receiving is not None
        self.receiving.received(data)

    def on_message_complete(self) -> None:
        assert self.receiving is not None
        request, self.receiving = self.receiving, None
        if self._direct is request:  # the parser saw all of the body after all
            self._direct = None
        request.ended()
        if request.discard:  # its early answer is out and the client has finished sending
            self._close()

    # -- answering -------------------------------------------------------------------------------

    def _answer_next(self) -> None:
        """Answer the request at the front of the pipeline: one at a time, and only while the
        client takes its answers."""
        transport = self.transport
        if (
            self.task is None
            and self.pipeline
            and "writing" not in self._paused
            and transport is not None
            and not transport.is_closing()
        ):
            self.task = asyncio.get_running_loop().create_task(self._answer(self.pipeline[0]))

    async def _answer(self, request: Request) -> None:
        response = await self.server.router.handle(request)
        self.pipeline.popleft()
        self.task = None
        self._send(response, head=request.method == "HEAD", request=request)

    def _send(self, response: Response, head: bool, request: Request | None = None) -> None:
        if self._closed or self.transport is None:
            return
        keep = request is not None and request.keep_alive and request.complete
        keep = keep and not response.close and not self.server.closing
        length = len(response.body)
        head_bytes = response.head(keep)
        if head or not length:
            self.write(head_bytes)
        elif length < 65536:
            self.write(head_bytes + response.body)
        else:
            # Not writelines(), which before Python 3.12 joins them: a copy of the body.
            self.write(head_bytes)
            self.write(response.body)
        self.resume("unclaimed")  # whatever the answered request held is no longer kept
        if request is not None and not request.complete:
            # Answered before the body was read: drop the rest as it comes, then close.
            request.discard, request.body_bytes = True, bytearray()
            self._expect_header(self.server.linger_s)
        elif not keep:
            self._close()
        elif self.pipeline:
            if len(self.pipeline) == 1:  # read on only once no other request waits
                self.resume("pipeline")
            self._answer_next()
        elif self.receiving is None:
            self._expect_header(self.server.header_timeout_s)

    def _last_request(self) -> None:
        for request in self.pipeline:
            request.keep_alive = False

    def close_if_idle(self) -> None:
        if self.task is None and self.receiving is None:
            self._close()
        else:
            self._last_request()

    # -- flow and time ---------------------------------------------------------------------------

    def write(self, data: bytes | bytearray) -> None:
        if self.transport is not None:
            self.transport.write(data)
            self.sending.wrote(len(data))

    def pause(self, reason: str) -> None:
        if not self._paused and self.transport is not None:
            self.transport.pause_reading()
        self._paused.add(reason)

    def resume(self, reason: str) -> None:
        if reason in self._paused:
            self._paused.discard(reason)
            if not self._paused and self.transport is not None:
                self.transport.resume_reading()

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_HEADER_BYTES:
            raise httptools.HttpParserError("request header too large")

    def _expect_header(self, timeout_s: float) -> None:
        """Close unless a request's header is complete within `timeout_s` (or, while lingering,
        the rest of the early-answered body has arrived)."""
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._close)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _close(self) -> None:
        self._stopped = True
        self._cancel_timer()
        if self.transport is not None and not self._closed:
            self.transport.close()
