"""perf_analyzer, Triton's own load generator, unchanged, against mcpd's `[serving] http` listener:
with tensors in the request bodies and through system shared memory. It reads the model's
metadata, configuration and statistics and unregisters CUDA shared memory at start and end, so this
holds mcpd to every endpoint it needs (docs/serving-protocol.md §8)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mqtt_broker import free_port
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config

RUN_S = 60


def perf_analyzer() -> str:
    """The program tests/run installs (.ci/env.sh mcpd_perf_analyzer); missing is a failure."""
    found = Path(sys.prefix) / "bin/perf_analyzer"
    if found.exists():
        return str(found)
    on_path = shutil.which("perf_analyzer")
    if on_path is None:
        pytest.fail("perf_analyzer is missing: tests/run installs it (.ci/env.sh)")
    return on_path


@pytest.fixture
def over_tcp(tmp_path: Path) -> Iterator[tuple[Served, int]]:
    port = free_port()
    model = {"name": "m", "path": str(scale(tmp_path / "scale.onnx")), "max_queue_delay_ms": 0.5}
    served = Served(config(tmp_path, [model], http=f"127.0.0.1:{port}"))
    served.wait_settled()
    yield served, port
    served.close()


async def _regions(served: Served) -> int:
    return len(served.service.shm.status(None, 0))


@pytest.mark.parametrize("memory", ["none", "system"])
def test_perf_analyzer_measures_a_throughput(over_tcp: tuple[Served, int], memory: str) -> None:
    served, port = over_tcp
    command = [
        perf_analyzer(), "-m", "m", "-u", f"127.0.0.1:{port}", "--shape", "x:4",
        "--shared-memory", memory, "--concurrency-range", "2",
        # A few short windows, and any spread counts as stable: this checks that it measures,
        # not what (bench/perf_analyzer.py measures).
        "--measurement-interval", "500", "--stability-percentage", "999", "--max-trials", "3",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    registered = 0
    deadline = time.monotonic() + RUN_S
    while process.poll() is None and time.monotonic() < deadline:
        registered = max(registered, served.call(_regions(served)))
        time.sleep(0.05)  # watching another process's progress: no clock to inject
    if process.poll() is None:
        process.kill()
    output = process.communicate()[0]
    assert process.returncode == 0, output
    throughput = re.search(r"Throughput: ([0-9.]+) infer/sec", output)
    assert throughput and float(throughput.group(1)) > 0, output
    # The server side of its report comes from mcpd's statistics.
    counted = re.search(r"Server: \n\s+Inference count: (\d+)", output)
    assert counted and int(counted.group(1)) > 0, output
    if memory == "system":
        assert registered >= 2, "perf_analyzer did not register its input and output regions"
    else:
        assert registered == 0
    assert served.call(_regions(served)) == 0  # it unregistered them at the end
