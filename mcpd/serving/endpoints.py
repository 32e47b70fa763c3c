"""The HTTP/1.1 endpoints: Open Inference Protocol (KServe v2), Triton's binary tensor data, system
shared memory and model repository extensions, and mcpd's own status and metrics
(docs/serving-protocol.md §1, §2).

Every error is the protocol's {"error": "..."} with the status Triton would use; nothing a client
sends can raise past the router (mcpd.serving.routes), which the HTTP server (mcpd.serving.http)
calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mcpd import __version__
from mcpd.config import DaemonSection
from mcpd.serving import codec, metrics, model_control, model_reports, responses, values
from mcpd.serving.errors import RequestError
from mcpd.serving.limits import JSON_ADVICE, Bodies
from mcpd.serving.peers import Peers
from mcpd.serving.repository import Repository
from mcpd.serving.request import Request
from mcpd.serving.routes import JSON, Response, Route, Router, error, get, post, reply
from mcpd.serving.shm import SharedMemory
from mcpd.serving.statistics import Timing
from mcpd.serving.worker import ModelWorker, Outputs, Pending
from mcpd.status import StatusDocument

EXTENSIONS = [
    "binary_tensor_data",
    "system_shared_memory",
    "model_repository",
    "statistics",
    "model_configuration",
]
OK = Response()
INLINE_JSON_BYTES = 64 * 2**10
"""A JSON answer up to this size (its bound) is written on the event loop, about 1.5 ms of FP32
values on a 2-core x86: less than the hop to another thread and back is worth; larger ones are
written in the encoder thread meanwhile."""


class Endpoints:
    def __init__(
        self,
        repository: Repository,
        shm: SharedMemory,
        status: Callable[[], StatusDocument | None],
        daemon: DaemonSection,
    ) -> None:
        self.repository = repository
        self.shm = shm
        self.status = status
        self.bodies = Bodies(daemon)
        self.exposition = metrics.Exposition(status, repository.stats)
        self.peers = Peers()
        self.encoder = ThreadPoolExecutor(1, thread_name_prefix="mcpd-json")
        """Writes large JSON answers, one at a time (each holds its text meanwhile)."""

    def close(self) -> None:
        self.encoder.shutdown(wait=False, cancel_futures=True)

    def _peer_uid(self, request: Request) -> int | None:
        return self.peers.uid(request.transport)

    def router(self) -> Router:
        model = "/v2/models/{name}"
        versioned = "/v2/models/{name}/versions/{version}"
        shm = "/v2/systemsharedmemory"
        cuda = "/v2/cudasharedmemory"
        routes: list[Route] = [
            # The inference routes first: routes are tried in order.
            *(post(f"{prefix}/infer", self.infer) for prefix in (model, versioned)),
            # Before model metadata, which would take "stats" for a model's name.
            get("/v2/models/stats", self.all_stats),
            *(get(f"{prefix}/stats", self.model_stats) for prefix in (model, versioned)),
            *(get(f"{prefix}/config", self.model_config) for prefix in (model, versioned)),
            get("/v2", self.server_metadata),
            get("/v2/health/live", self.live),
            get("/v2/health/ready", self.ready),
            *(get(prefix, self.model_metadata) for prefix in (model, versioned)),
            *(get(f"{prefix}/ready", self.model_ready) for prefix in (model, versioned)),
            post("/v2/repository/index", self.index),
            post("/v2/repository/models/{name}/load", self.load),
            post("/v2/repository/models/{name}/unload", self.unload),
            get(f"{shm}/status", self.shm_status),
            get(f"{shm}/region/{{region}}/status", self.shm_status),
            post(f"{shm}/region/{{region}}/register", self.shm_register),
            post(f"{shm}/unregister", self.shm_unregister),
            post(f"{shm}/region/{{region}}/unregister", self.shm_unregister),
            get(f"{cuda}/status", self.cuda_status),
            get(f"{cuda}/region/{{region}}/status", self.cuda_status),
            post(f"{cuda}/region/{{region}}/register", self.cuda_register),
            post(f"{cuda}/unregister", self.cuda_unregister),
            post(f"{cuda}/region/{{region}}/unregister", self.cuda_unregister),
            get("/v2/mcpd/status", self.mcpd_status),
            get("/metrics", self.metrics),
        ]
        return Router(routes)

    def metrics_router(self) -> Router:
        """The `[metrics] listen` port: GET /metrics and nothing else (404 names the one path)."""
        return Router([get("/metrics", self.metrics)])

    # -- health and metadata ---------------------------------------------------------------------

    async def server_metadata(self, request: Request) -> Response:
        return reply({"name": "mcpd", "version": __version__, "extensions": EXTENSIONS})

    async def live(self, request: Request) -> Response:
        return OK

    async def ready(self, request: Request) -> Response:
        return Response(200 if self.repository.all_ready else 400)

    async def model_metadata(self, request: Request) -> Response:
        name, version = request.params["name"], request.params.get("version")
        _, worker = self.repository.serving(name, version)
        backend = worker.backend
        return reply(
            {
                "name": name,
                "versions": [codec.VERSION],
                "platform": backend.platform,
                "inputs": [spec.metadata() for spec in backend.inputs],
                "outputs": [spec.metadata() for spec in backend.outputs],
            }
        )

    async def model_ready(self, request: Request) -> Response:
        entry = self.repository.get(request.params["name"], request.params.get("version"))
        return Response(200 if entry.worker is not None else 400)

    async def index(self, request: Request) -> Response:
        body = await self._json_object(request, "the index request", empty=True)
        return reply(model_control.index(self.repository.entries, body))

    async def load(self, request: Request) -> Response:
        """Load a model of the configuration again from its file; 200 once it serves."""
        model_control.check_load(await self._json_object(request, "the load request", empty=True))
        await self.repository.load(request.params["name"])
        return OK

    async def unload(self, request: Request) -> Response:
        body = await self._json_object(request, "the unload request", empty=True)
        model_control.check_unload(body)
        await self.repository.unload(request.params["name"])
        return OK

    # -- Triton's statistics and model configuration (docs/serving-protocol.md §8.3, §8.4) --------

    async def all_stats(self, request: Request) -> Response:
        entries = self.repository.entries.items()
        return reply(model_reports.all_stats({n: e.statistics.snapshot() for n, e in entries}))

    async def model_stats(self, request: Request) -> Response:
        name = request.params["name"]
        entry = self.repository.get(name, request.params.get("version"))
        return reply(model_reports.all_stats({name: entry.statistics.snapshot()}))

    async def model_config(self, request: Request) -> Response:
        name = request.params["name"]
        entry, worker = self.repository.serving(name, request.params.get("version"))
        return reply(model_reports.model_config(entry.config, worker.backend))

    # -- inference -------------------------------------------------------------------------------

    async def infer(self, request: Request) -> Response:
        name, version = request.params["name"], request.params.get("version")
        entry, _ = self.repository.serving(name, version)  # a 404 before the body is read
        started = time.monotonic()
        try:
            header_length = values.header_length(
                request.headers.get("inference-header-content-length")
            )
            async with self._body(request, header_length) as body:
                # Looked up again once the body is in: a reload may have retired the worker that
                # served when the head arrived (a 503 "being unloaded" under a load flood).
                entry, worker = self.repository.serving(name, version)
                interface = entry.interface
                assert interface is not None  # set together with the worker
                shm = self.shm.peer(self._peer_uid(request))
                decoded = codec.decode(body, header_length, interface, shm)
                outputs, timing = await self._run(worker, decoded, entry.config.timeout_ms, started)
                response = responses.respond(
                    name,
                    decoded,
                    outputs,
                    interface.outputs,
                    shm,
                    self.bodies.daemon.max_json_output_bytes,
                )
            if response.json_bytes <= INLINE_JSON_BYTES:
                payload, json_length = response.encode()
            else:
                loop = asyncio.get_running_loop()
                payload, json_length = await loop.run_in_executor(self.encoder, response.encode)
        except RequestError:
            entry.statistics.failed(round((time.monotonic() - started) * 1e9))
            raise
        elapsed = time.monotonic() - started
        entry.statistics.succeeded(round(elapsed * 1e9), timing)
        entry.latencies.append(elapsed)
        if json_length is None:
            return Response(200, payload, JSON)
        return Response(
            200,
            payload,
            "application/octet-stream",
            {"Inference-Header-Content-Length": str(json_length)},
        )

    def _body(
        self, request: Request, header_length: int | None
    ) -> contextlib.AbstractAsyncContextManager[bytearray]:
        """A request's JSON is parsed on the event loop, holding the interpreter the control loop
        needs too (BENCHMARKS.md): it has a smaller limit than binary tensors."""
        daemon = self.bodies.daemon
        if header_length is not None and header_length > daemon.max_json_bytes:
            raise RequestError(
                f"JSON header of {header_length} bytes over the limit of {daemon.max_json_bytes} "
                f"bytes ([daemon] max_json_bytes){JSON_ADVICE}",
                413,
            )
        if header_length is None and daemon.max_json_bytes < daemon.max_request_bytes:
            return self.bodies.read(request, daemon.max_json_bytes, "max_json_bytes", JSON_ADVICE)
        return self.bodies.read(request, daemon.max_request_bytes, "max_request_bytes")

    async def _json_object(
        self, request: Request, what: str = "the request", empty: bool = False
    ) -> dict[str, Any]:
        """The body's JSON object; with `empty`, an empty body is `{}`."""
        async with self.bodies.read(
            request, self.bodies.daemon.max_json_bytes, "max_json_bytes"
        ) as body:
            if empty and not body.strip():
                return {}
            document = values.parse_json(body, what)
        if not isinstance(document, dict):
            raise RequestError(f"{what}: the body must be a JSON object")
        return document

    async def _run(
        self, worker: ModelWorker, decoded: codec.InferRequest, timeout_ms: int, started: float
    ) -> tuple[Outputs, Timing]:
        """The outputs, and what the request spent in the worker."""
        timeouts = [t for t in (timeout_ms * 1000, decoded.timeout_us) if t]
        timeout = min(timeouts) / 1e6 if timeouts else None
        future: asyncio.Future[Outputs] = asyncio.get_running_loop().create_future()
        pending = Pending(
            decoded.inputs, future, started, None if timeout is None else started + timeout
        )
        worker.submit(pending)
        try:
            outputs = await (future if timeout is None else asyncio.wait_for(future, timeout))
        except asyncio.TimeoutError:
            worker.cancel(pending)
            raise RequestError(
                f"request timed out after {min(timeouts) / 1000:.0f} ms", 503
            ) from None
        except asyncio.CancelledError:  # the client disconnected
            worker.cancel(pending)
            raise
        assert pending.timing is not None  # set by the worker before it answers
        return outputs, pending.timing

    # -- shared memory ---------------------------------------------------------------------------

    async def shm_status(self, request: Request) -> Response:
        return reply(self.shm.status(request.params.get("region"), self._peer_uid(request)))

    async def shm_register(self, request: Request) -> Response:
        body = await self._json_object(request)
        key = body.get("key")
        if not isinstance(key, str):
            raise RequestError("register needs key (a string)")
        offset = values.integer(body.get("offset", 0), "register: offset")
        size = values.integer(body.get("byte_size"), "register: byte_size")
        uid = self._peer_uid(request)
        if uid is None:
            raise RequestError(
                "shared memory registration needs a client whose user mcpd can tell: one on the "
                "Unix socket or on a loopback address of [serving] http"
            )
        self.shm.register(request.params["region"], key, offset, size, uid)
        return OK

    async def shm_unregister(self, request: Request) -> Response:
        self.shm.unregister(request.params.get("region"), self._peer_uid(request))
        return OK

    # CUDA shared memory (§8.5): answered as a Triton without CUDA memory answers, because
    # perf_analyzer unregisters all of it at start and end, whatever --shared-memory says.

    async def cuda_status(self, request: Request) -> Response:
        region = request.params.get("region")
        if region is not None:
            raise RequestError(f"Unable to find cuda shared memory region: {region!r}", 404)
        return reply([])

    async def cuda_register(self, request: Request) -> Response:
        raise RequestError("CUDA shared memory is not supported: mcpd has no CUDA memory", 501)

    async def cuda_unregister(self, request: Request) -> Response:
        return OK

    # -- mcpd ------------------------------------------------------------------------------------

    async def mcpd_status(self, request: Request) -> Response:
        document = self.status()
        if document is None:
            return error("the governor has not published its status yet; try again", 503)
        return reply(document)

    async def metrics(self, request: Request) -> Response:
        body, content_type = self.exposition.render(request.headers.get("accept", ""))
        return Response(200, body, content_type)
