"""A steady stream of demo inferences for examples/demo, so the live line shows requests being
served while the governor moves the batch size.

    python -m mcpd.demo.load SOCKET [--clients 4] [--rate 100]
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

from mcpd.client import Client, ServerError


def client(socket_path: str, interval_s: float, stop: threading.Event, seed: int) -> None:
    image = np.random.default_rng(seed).random((1, 3, 64, 64), dtype=np.float32)
    with Client(socket_path, timeout=10.0) as mcpd:
        deadline = time.monotonic()
        while not stop.is_set():
            try:
                mcpd.infer("demo", {"image": image})
            except (OSError, ServerError):
                stop.wait(0.5)  # the daemon is starting, reloading or gone: try again shortly
            deadline = max(deadline + interval_s, time.monotonic())
            stop.wait(max(0.0, deadline - time.monotonic()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("socket")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--rate", type=float, default=100.0, help="requests per second, all clients"
    )
    args = parser.parse_args()
    stop = threading.Event()
    interval = args.clients / args.rate
    threads = [
        threading.Thread(target=client, args=(args.socket, interval, stop, n), daemon=True)
        for n in range(args.clients)
    ]
    for thread in threads:
        thread.start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stop.set()


if __name__ == "__main__":
    main()
