"""The inference service the daemon starts: socket, HTTP server, models, shared memory."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from aiohttp import web

from mcpd.config import Config
from mcpd.events import EventBus
from mcpd.optimize.background import Optimizer
from mcpd.serving.app import Endpoints
from mcpd.serving.listen import Listener, listen
from mcpd.serving.repository import Repository
from mcpd.serving.shm import SharedMemory
from mcpd.state import ModelStats

log = logging.getLogger("mcpd.serving")

SHUTDOWN_TIMEOUT_S = 10.0
"""How long stop() lets answers to requests already taken finish."""


class InferenceService:
    name = "serving"

    def __init__(
        self,
        config: Config,
        status: Callable[[], dict[str, Any]],
        batch_size: Callable[[str], int],
        events: EventBus,
        *,
        shm_root: str = "/dev/shm",
    ) -> None:
        self.config = config
        self.repository = Repository(
            batch_size,
            events,
            config.daemon.max_request_bytes,
            Optimizer(config.daemon.state_dir),
        )
        self.shm = SharedMemory(shm_root)
        self.endpoints = Endpoints(
            self.repository, self.shm, status, config.daemon.max_request_bytes
        )
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None

    async def start(self) -> None:
        """Bind (or take systemd's socket), start serving, start loading models in the background."""
        self._listener = listen(self.config.daemon.socket, self.config.daemon.socket_group)
        # handler_cancellation: a client that disconnects cancels its handler, which takes its
        # request out of the queue.
        runner = web.AppRunner(
            self.endpoints.application(),
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        )
        await runner.setup()
        await web.SockSite(runner, self._listener.sock).start()
        self._runner = runner
        where = self._listener.path or "the socket passed by systemd"
        log.info("serving the Open Inference Protocol on %s", where)
        await self.repository.apply(self.config.models)

    async def stop(self) -> None:
        """Stop accepting, finish the queued requests, release the models and shared memory."""
        if self._runner is not None:
            await self._runner.shutdown()  # stop listening; answers in flight go on
        await self.repository.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.shm.close()
        if self._listener is not None and self._listener.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._listener.path)
        self._listener = None

    async def reload(self, config: Config) -> None:
        """Models are added, removed or replaced; the socket and the size limit stay as started
        (the socket is bound, and the limit is built into the HTTP server)."""
        if config.daemon.max_request_bytes != self.config.daemon.max_request_bytes:
            log.warning("reload: [daemon] max_request_bytes changes only on restart")
        self.config = config
        await self.repository.apply(config.models)

    def stats(self) -> dict[str, ModelStats]:
        return self.repository.stats()
