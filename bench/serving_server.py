"""mcpd's inference service alone (no control loop), for bench/serving.py: serves one model on a
socket with the batch size fixed at max_batch, until SIGTERM.

    python bench/serving_server.py MODEL.onnx MAX_BATCH SOCKET [uvloop] [--model JSON] [--http ADDR]

With `uvloop`, on uvloop's event loop instead of asyncio's (to measure it). `--model` gives the
model's `[[models]]` keys that say what runs it, as JSON (`{"backend": "openvino", "openvino":
{"precision": "bf16"}}`), instead of onnxruntime's CPU provider; `--http HOST:PORT` serves the same
endpoints on that TCP port too (`[serving] http`, for tritonclient, which dials TCP only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcpd.config import parse
from mcpd.events import EventBus
from mcpd.serving.service import InferenceService


async def main(args: argparse.Namespace) -> None:
    model: dict[str, Any] = {"name": "m", "path": args.path, "max_batch": args.max_batch}
    cfg = parse(
        {
            "daemon": {"socket": args.socket},
            "serving": {"http": args.http},
            "models": [{**model, **args.model}],
        }
    )
    service = InferenceService(cfg, dict, lambda name: args.max_batch, EventBus())
    await service.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await service.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("max_batch", type=int)
    parser.add_argument("socket")
    parser.add_argument("loop", nargs="?", choices=["uvloop"])
    parser.add_argument("--model", type=json.loads, default={"onnxruntime": {"providers": ["cpu"]}})
    parser.add_argument("--http", default="")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(main(args))
    else:
        asyncio.run(main(args))
