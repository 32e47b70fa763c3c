"""Real time-series stores for the ingest tests and benchmark: VictoriaMetrics, Prometheus with
its remote-write receiver, and vmagent replicating to several VictoriaMetrics (Debian's
`victoria-metrics` and `prometheus` packages; tests/run installs them).

Each runs from its own folder on a free loopback port, can be killed and started again on the same
port (an outage), and answers PromQL over HTTP.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.mqtt_broker import free_port

STARTUP_S = 20.0


def binary(name: str) -> str | None:
    return shutil.which(name, path="/usr/bin:/usr/sbin:/bin")


class Engine:
    """A store's process: started, probed until ready, stopped or killed."""

    name = ""
    ready_path = "/health"

    def __init__(self, folder: Path) -> None:
        found = binary(self.name)
        if found is None:
            raise RuntimeError(f"{self.name} is not installed (tests/run installs it)")
        self.binary = found
        self.folder = folder
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arguments(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        with open(self.folder / "stderr.log", "ab") as log:
            self.process = subprocess.Popen(
                [self.binary, *self.arguments()], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + STARTUP_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=1) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready: {self.log_tail()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=20)
        self.process = None

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self) -> str:
        path = self.folder / "stderr.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else "(no log)"

    def get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as answer:
            return json.load(answer)

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        """An instant query's result: a vector, or raw samples for a range selector."""
        answer = self.get("/api/v1/query", query=promql, time=f"{at:.3f}")
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def raw(self, selector: str, start: float, end: float) -> dict[str, list[tuple[int, float]]]:
        """Every stored sample of the series `selector` names between `start` and `end`, by
        instance: (ms, value), as stored (a range selector returns raw samples)."""
        window_ms = max(1, round((end - start) * 1000))
        found: dict[str, list[tuple[int, float]]] = {}
        for series in self.query(f"{selector}[{window_ms}ms]", end):
            points = [(round(float(t) * 1000), float(v)) for t, v in series["values"]]
            found.setdefault(series["metric"].get("instance", ""), []).extend(points)
        return found

    def flush(self) -> None:
        """Make what was written searchable now (a no-op where the store needs none)."""


class VictoriaMetrics(Engine):
    name = "victoria-metrics"

    def __init__(self, folder: Path, *, dedup: bool = True, cache: bool = False) -> None:
        super().__init__(folder)
        self.dedup = dedup
        self.cache = cache
        """Off for the tests (what was just written is asked for at once); on where a bench
        times queries as an operator's store answers them."""

    @property
    def write_url(self) -> str:
        return self.url + "/api/v1/write"

    def arguments(self) -> list[str]:
        return [
            f"-httpListenAddr=127.0.0.1:{self.port}",
            f"-storageDataPath={self.folder / 'data'}",
            # The newest 30 s are hidden from queries by default (for scrapes still arriving).
            "-search.latencyOffset=0s",
            *([] if self.cache else ["-search.disableCache"]),
            "-retentionPeriod=100y",
            # One sample per series and millisecond: a sample written twice (an ingest process
            # killed after the store took a request and before it acknowledged it) is stored
            # once, as docs/ingest.md §2 tells operators to configure it. Without it, every
            # sample written is seen, twice if written twice.
            *(["-dedup.minScrapeInterval=1ms"] if self.dedup else []),
        ]

    def flush(self) -> None:
        with urllib.request.urlopen(self.url + "/internal/force_flush", timeout=10):
            pass

    def export(self, selector: str, start: float, end: float) -> dict[str, list[int]]:
        """Every stored sample time (ms) of the series `selector` names between `start` and
        `end`, by instance, from /api/v1/export: the store's own data, no query engine between."""
        query = urllib.parse.urlencode({"match[]": selector, "start": start, "end": end})
        found: dict[str, list[int]] = {}
        with urllib.request.urlopen(f"{self.url}/api/v1/export?{query}", timeout=60) as answer:
            for line in answer:
                series = json.loads(line)
                found.setdefault(series["metric"].get("instance", ""), []).extend(
                    series["timestamps"]
                )
        return found

    def import_prometheus(self, text: str) -> None:
        """Samples in the Prometheus text format (timestamps in ms), searchable on return."""
        request = urllib.request.Request(
            f"{self.url}/api/v1/import/prometheus", data=text.encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            if answer.status != 204:
                raise RuntimeError(f"import answered {answer.status}")
        self.flush()


class Prometheus(Engine):
    name = "prometheus"
    ready_path = "/-/ready"

    @property
    def write_url(self) -> str:
        return self.url + "/api/v1/write"

    def arguments(self) -> list[str]:
        config = self.folder / "prometheus.yml"
        config.write_text("global: {}\n")
        return [
            f"--config.file={config}",
            f"--storage.tsdb.path={self.folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-remote-write-receiver",
        ]


class VMAgent(Engine):
    """vmagent replicating every write to each of `stores` (its disk queue holds what one that
    is down has not taken)."""

    name = "vmagent"

    def __init__(self, folder: Path, stores: list[VictoriaMetrics]) -> None:
        super().__init__(folder)
        self.stores = stores

    @property
    def write_url(self) -> str:
        return self.url + "/api/v1/write"

    def arguments(self) -> list[str]:
        return [
            f"-httpListenAddr=127.0.0.1:{self.port}",
            f"-remoteWrite.tmpDataPath={self.folder / 'queue'}",
            *(f"-remoteWrite.url={store.write_url}" for store in self.stores),
        ]
