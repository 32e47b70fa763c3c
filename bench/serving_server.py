"""mcpd's inference service alone (no control loop), for bench/serving.py: serves one model on a
socket with the batch size fixed at max_batch, until SIGTERM.

    python bench/serving_server.py MODEL.onnx MAX_BATCH SOCKET [uvloop]

With `uvloop`, on uvloop's event loop instead of asyncio's (to measure it).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcpd.config import parse
from mcpd.events import EventBus
from mcpd.serving.service import InferenceService


async def main(model: str, max_batch: int, socket: str) -> None:
    cfg = parse(
        {
            "daemon": {"socket": socket},
            "models": [
                {
                    "name": "m",
                    "path": model,
                    "max_batch": max_batch,
                    "onnxruntime": {"providers": ["cpu"]},
                }
            ],
        }
    )
    service = InferenceService(cfg, dict, lambda name: max_batch, EventBus())
    await service.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await service.stop()


if __name__ == "__main__":
    if sys.argv[4:] == ["uvloop"]:
        import uvloop

        uvloop.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
    else:
        asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
