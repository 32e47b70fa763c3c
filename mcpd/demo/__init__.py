"""The bundled demo model (demo.onnx): a small image classifier with random weights, so the demo
serves inference without downloading anything. `python -m mcpd.demo.build` regenerates it
(byte-identical; a test checks that)."""

from __future__ import annotations

from pathlib import Path

MODEL = Path(__file__).with_name("demo.onnx")
