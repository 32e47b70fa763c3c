"""The conventional peer for bench/serving.py: FastAPI + uvicorn over TCP, JSON tensors, the same
onnxruntime model, one request at a time per worker thread (FastAPI runs sync handlers in its
thread pool).

    PEER_MODEL=model.onnx uvicorn --app-dir bench serving_peer:app --port 8000
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI

app = FastAPI()
session = ort.InferenceSession(os.environ["PEER_MODEL"], providers=["CPUExecutionProvider"])
name = session.get_inputs()[0].name


@app.post("/infer")
def infer(body: dict[str, Any]) -> dict[str, Any]:
    x = np.asarray(body["inputs"], dtype=np.float32)
    return {"outputs": [output.tolist() for output in session.run(None, {name: x})]}
