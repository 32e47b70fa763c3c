"""The inference service the daemon starts: socket, HTTP server, models, shared memory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Mapping

from mcpd.config import Config, tcp_listeners
from mcpd.events import EventBus
from mcpd.listen import Listener, bind_tcp_listeners, listen
from mcpd.optimize.background import Optimizer
from mcpd.placement.plan import ModelPlacement
from mcpd.serving.connections import SOCKET_CAP, Acceptor, connection_cap
from mcpd.serving.endpoints import Endpoints
from mcpd.serving.http import HttpServer
from mcpd.serving.limits import Throttle
from mcpd.serving.repository import Repository
from mcpd.serving.routes import Router
from mcpd.serving.shm import SharedMemory
from mcpd.snapshot import ModelStats
from mcpd.status import StatusDocument

log = logging.getLogger("mcpd.serving")

SHUTDOWN_TIMEOUT_S = 10.0
"""How long stop() lets answers to requests already taken finish."""
LINGER_S = 1.0
"""How long the rest of a body the handler did not read (an error answered early) is read and
dropped before the connection closes, so that a client still sending can read the answer; long
enough for a local client, short enough that a slow one cannot hold its connection."""
STATUS_POLL_S = 0.1
"""How often the GPU check looks for the governor's first status document (published a few
times a second)."""
METRICS_CONNECTIONS = 8
"""At once on the `[metrics] listen` port: Prometheus scrapes over one kept-alive connection; a few
more for a person with curl. The port's connections do not count against max_connections."""


class InferenceService:
    name = "serving"

    def __init__(
        self,
        config: Config,
        status: Callable[[], StatusDocument | None],
        batch_size: Callable[[str], int],
        events: EventBus,
        *,
        shm_root: str = "/dev/shm",
        listener: Listener | None = None,
        tcp: Mapping[str, socket.socket] | None = None,
        placements: Mapping[str, ModelPlacement] | None = None,
    ) -> None:
        """`placements`: where each model's threads run (the governor's placement plan); none
        placed without one."""
        self.config = config
        self.placements = dict(placements or {})
        self.status = status
        self.gpu_check: asyncio.Task[None] | None = None
        self.tidying: asyncio.Task[None] | None = None
        """The optimized models' cache, tidied in the background at start (Optimizer.tidy)."""
        self.optimizer = Optimizer(config.daemon.state_dir)
        self.repository = Repository(
            batch_size, events, config.daemon.max_request_bytes, self.optimizer
        )
        self.shm = SharedMemory(shm_root)
        self.endpoints = Endpoints(self.repository, self.shm, status, config.daemon)
        self.throttle = Throttle()
        self.connections: Acceptor | None = None
        self.scrapes: Acceptor | None = None
        """Connections on the `[metrics] listen` port."""
        self.server: HttpServer | None = None
        self.metrics_server: HttpServer | None = None
        self._given = listener
        """A socket someone else holds (the governor): used as it is, never bound or removed."""
        self._given_tcp = dict(tcp or {})
        """The TCP listeners the governor holds, with `listener`, by role (config.tcp_listeners)."""
        self._listener: Listener | None = None
        self._tcp: dict[str, socket.socket] = {}

    async def start(self) -> None:
        """Bind (or take systemd's socket), start serving, start loading models in the background."""
        if self._given is not None:
            self._listener, self._tcp = self._given, self._given_tcp
        else:
            self._listener = listen(self.config.daemon.socket, self.config.daemon.socket_group)
            self._tcp = bind_tcp_listeners(tcp_listeners(self.config))
        self.throttle.install()
        cap = connection_cap(self.config.daemon.max_connections)
        listening = [self._listener.sock] + ([self._tcp["http"]] if "http" in self._tcp else [])
        self.server, self.connections = self._serve(
            self.endpoints.router(),
            listening,
            lambda: min(cap, self.config.daemon.max_connections),
        )
        if "metrics" in self._tcp:
            self.metrics_server, self.scrapes = self._serve(
                self.endpoints.metrics_router(),
                [self._tcp["metrics"]],
                lambda: METRICS_CONNECTIONS,
                "the [metrics] listen port's",
            )
            log.info("serving /metrics on %s", self.config.metrics.listen)
        where = self._listener.path or "the socket passed by systemd"
        if "http" in self._tcp:
            where += f" and {self.config.serving.http}"
        log.info("serving the Open Inference Protocol on %s", where)
        self.gpu_check = asyncio.create_task(self._warn_if_gpu_unused())
        self.tidying = asyncio.create_task(
            asyncio.to_thread(self.optimizer.tidy, self.config.models)
        )
        await self.repository.apply(self.config.models, self.placements)

    def _serve(
        self,
        router: Router,
        listening: list[socket.socket],
        cap: Callable[[], int],
        cap_name: str = SOCKET_CAP,
    ) -> tuple[HttpServer, Acceptor]:
        daemon = self.config.daemon
        server = HttpServer(
            router,
            daemon.header_timeout_ms / 1000,
            LINGER_S,
            daemon.send_timeout_ms / 1000,
            self.endpoints.bodies,
        )
        acceptor = Acceptor(listening, server, cap, cap_name)
        acceptor.start()
        return server, acceptor

    async def _warn_if_gpu_unused(self) -> None:
        """A Jetson serving on the CPU because its onnxruntime lacks the GPU providers says so
        once, as soon as the governor's first status document names the board."""
        while (document := self.status()) is None:
            await asyncio.sleep(STATUS_POLL_S)
        platform = document["platform"]
        if platform.startswith("jetson"):
            from mcpd.serving.backends import onnxrt

            warning = onnxrt.gpu_missing(platform, onnxrt.available_providers())
            if warning:
                log.warning("%s", warning)

    async def stop(self) -> None:
        """Stop accepting, finish the queued requests, release the models and shared memory."""
        for task in (self.gpu_check, self.tidying):
            if task is not None:
                task.cancel()
        for acceptor in (self.connections, self.scrapes):
            if acceptor is not None:
                acceptor.stop()  # answers in flight go on
        servers = [s for s in (self.server, self.metrics_server) if s is not None]
        await asyncio.gather(*(server.shutdown(SHUTDOWN_TIMEOUT_S) for server in servers))
        await self.repository.close()
        self.endpoints.close()
        self.server = self.metrics_server = None
        self.shm.close()
        self.throttle.remove()
        if self._listener is not None:
            self._listener.sock.close()
            if self._listener.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._listener.path)
        for sock in self._tcp.values():
            sock.close()
        self._listener, self._tcp = None, {}

    async def reload(
        self, config: Config, placements: Mapping[str, ModelPlacement] | None = None
    ) -> None:
        """Models are added, removed, replaced or placed elsewhere and the request limits apply at
        once; the socket, the largest tensor (built into each model's interface) and the header
        and send timeouts (built into the HTTP server) stay as started."""
        for key in ("max_request_bytes", "header_timeout_ms", "send_timeout_ms"):
            if getattr(config.daemon, key) != getattr(self.config.daemon, key):
                log.warning("reload: [daemon] %s changes only on restart", key)
        if tcp_listeners(config) != tcp_listeners(self.config):
            log.warning("reload: [serving] http and [metrics] listen change only on restart")
        self.config = config
        self.placements = dict(placements or {})
        self.endpoints.bodies.daemon = config.daemon
        await self.repository.apply(config.models, self.placements)

    def stats(self) -> dict[str, ModelStats]:
        return self.repository.stats()
