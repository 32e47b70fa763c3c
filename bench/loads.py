"""Model loads asked for by hostile clients, against the real daemon (issue 26, item 4 and 9).

    .venv/bin/python bench/loads.py [--layers 100] [--hangups 16] [--flood-seconds 8]

Runs `mcpd run --simulate rk3588` (as tests/governor/test_daemon.py does) serving `heavy` (LAYERS matrix products by random
1 MB weights: a model of LAYERS MB, made of tensors glibc's heap keeps when freed, as a real
network's are) and `broken` (a file that is not a model). Reports the serving process's RSS at
ready, its peak (sampled every 50 ms) and its end while HANGUPS load requests of `heavy` whose
clients hang up at once are served; then, for FLOOD_SECONDS, 4 clients asking in a loop for the
load of `broken`: the requests answered, and the lines the daemon's log grew by (each failure said
is a log line and a `model` event the governor spools for MQTT).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcpd.client import Client, ServerError
from tests.support.daemon import RunningDaemon, models_ready
from tests.support.serving_models import heavy


def hang_ups(sock: Path, count: int, serving: psutil.Process, log: Path) -> dict[str, float]:
    before = serving.memory_info().rss / 1e6
    reloads = log.read_text().count("model heavy reloaded")
    for _ in range(count):
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(sock))
            client.sendall(
                b"POST /v2/repository/models/heavy/load HTTP/1.1\r\nHost: mcpd\r\n"
                b"Content-Length: 0\r\n\r\n"
            )
    peak = before
    while log.read_text().count("model heavy reloaded") == reloads:
        peak = max(peak, serving.memory_info().rss / 1e6)
        time.sleep(0.05)
    with Client(str(sock), timeout=600) as client:
        client.load("heavy")  # answered once everything asked before it is done
    after = serving.memory_info().rss / 1e6
    return {"rss_before_mb": before, "rss_peak_mb": max(peak, after), "rss_after_mb": after}


def flood(sock: Path, seconds: float, log: Path) -> dict[str, float]:
    lines = len(log.read_text().splitlines())
    size = log.stat().st_size
    answered = [0]
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client() -> None:
        with Client(str(sock), timeout=30) as connection:
            while time.monotonic() < end:
                try:
                    connection.load("broken")
                except ServerError:
                    with lock:
                        answered[0] += 1

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(1)  # the governor's log of the last events
    text = log.read_text()
    return {
        "failed_loads": answered[0],
        "log_lines": len(text.splitlines()) - lines,
        "log_kb": round((log.stat().st_size - size) / 1e3, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=100)
    parser.add_argument("--hangups", type=int, default=16)
    parser.add_argument("--flood-seconds", type=float, default=8.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        model = heavy(tmp / "heavy.onnx", layers=args.layers)
        broken = tmp / "broken.onnx"
        broken.write_bytes(b"not a model")
        sock = tmp / "mcpd.sock"
        daemon = RunningDaemon(
            tmp,
            f'[daemon]\nsocket = "{sock}"\nstate_dir = "{tmp / "state"}"\n'
            f'[[models]]\nname = "heavy"\npath = "{model}"\nmax_batch = 4\n'
            f'[[models]]\nname = "broken"\npath = "{broken}"\n',
        )
        try:
            daemon.wait_for(lambda: models_ready(sock, "heavy"), 120)
            with Client(str(sock)) as client:
                serving = psutil.Process(client.status()["serving"]["pid"])
            result = {
                "model_mb": round(model.stat().st_size / 1e6, 1),
                **hang_ups(sock, args.hangups, serving, daemon.log),
                **flood(sock, args.flood_seconds, daemon.log),
            }
        finally:
            daemon.close()
    print(json.dumps({k: round(v, 1) for k, v in result.items()}, indent=1))


if __name__ == "__main__":
    main()
