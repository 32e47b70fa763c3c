"""An InferenceService running on its own event loop thread, for tests that talk to it through
the real Unix socket with blocking clients."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from mcpd.client import Client
from mcpd.config import Config, ModelSection, parse
from mcpd.events import Event, EventBus
from mcpd.serving.service import InferenceService
from mcpd.status import StatusDocument
from tests.support.mqtt_status import placement
from tests.support.waiting import wait_until

T = TypeVar("T")


def status_document() -> StatusDocument:
    """A whole status document (mcpd.status's contract), as the governor publishes it."""
    return {
        "ts": 1.0,
        "platform": "jetson-orin",
        "model": "test board",
        "temperature_c": 61.5,
        "power_w": 7.25,
        "power_estimated": False,
        "power_source": "meter",
        "temperatures": {"cpu-thermal": 61.5},
        "powers": {"VDD_IN": 7.25},
        "domains": {
            "policy0": {
                "kind": "cpufreq",
                "cap_mhz": 1510.4,
                "cur_mhz": 1200.0,
                "target_mhz": 1510.4,
                "min_mhz": 115.2,
                "max_mhz": 1510.4,
                "write_failure": None,
            },
        },
        "thermal": {"headroom": 0.65, "seconds_to_throttle": None},
        "cooling": {
            "state": "normal",
            "thermal_resistance_c_per_w": 6.41,
            "time_constant_s": 36.2,
            "intercept_c": 8.4,
            "confidence": 0.97,
            "baseline_c_per_w": 6.38,
            "drift_ratio": 1.005,
            "since": None,
            "updated": 1.7e9,
            "windows": 9,
            "rejected": 2,
        },
        "governor": {
            "state": "holding",
            "policy": "hysteresis",
            "profile": "default",
            "external_cap_changes": 0,
            "last_action": None,
        },
        "batch": {"m": 4},
        "inference": {},
        "daemon": {
            "pid": 4241,
            "cpu_percent": 1.0,
            "rss_mb": 50.0,
            "uptime_s": 3.0,
            "version": "0.1.0",
            "scheduling": "normal",
        },
        "serving": {
            "pid": 4242,
            "state": "ready",
            "restarts": 0,
            "last_exit": None,
            "config_error": None,
        },
        "loop": {"sample_lateness": None, "sample_to_write": None},
        "mqtt": {"broker": "broker-2.lan:1883", "since": 0.5},
        "placement": placement(),
    }


def config(
    tmp_path: Path,
    models: list[dict[str, Any]],
    *,
    http: str = "",
    metrics: str = "",
    **daemon: Any,
) -> Config:
    """A config serving `models` on a socket in tmp_path (and on TCP at `http`, and /metrics at
    `metrics`, if given)."""
    return parse(
        {
            "daemon": {"socket": str(tmp_path / "mcpd.sock"), **daemon},
            "serving": {"http": http},
            "metrics": {"listen": metrics},
            "models": models,
        }
    )


class Served:
    def __init__(
        self,
        cfg: Config,
        batch_size: Callable[[str], int] = lambda name: 8,
        status: Callable[[], StatusDocument | None] = status_document,
    ) -> None:
        self.socket = cfg.daemon.socket
        self.events: list[Event] = []
        bus = EventBus()
        bus.subscribe(self.events.append)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.service = self.call(self._make(cfg, status, batch_size, bus))
        self.call(self.service.start())

    @staticmethod
    async def _make(
        cfg: Config,
        status: Callable[[], StatusDocument | None],
        batch_size: Callable[[str], int],
        bus: EventBus,
    ) -> InferenceService:
        return InferenceService(cfg, status, batch_size, bus)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def client(self) -> Client:
        return Client(self.socket, timeout=30)

    def wait_settled(self, timeout: float = 30) -> None:
        """Until no load (first load or replacement) is still running."""
        wait_until(
            lambda: not self.service.repository.loading, timeout, "the models loaded", interval=0.01
        )

    def reload(self, models: list[ModelSection]) -> None:
        cfg = dataclasses.replace(self.service.config, models=tuple(models))
        self.call(self.service.reload(cfg))

    def close(self) -> None:
        try:
            self.call(self.service.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
