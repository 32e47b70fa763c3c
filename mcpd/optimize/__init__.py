"""`mcpd optimize` (make a model fast for its board and prove it still answers the same) and
`mcpd bench`; their options are in mcpd.cli.optimize and mcpd.cli.bench."""

from __future__ import annotations

ROCKCHIP = ("rk3588", "rk3576", "rk3568", "rk3566", "rk3562")  # rknn-toolkit2's NPUs
TARGETS = ("cpu", "openvino", "cuda", "tensorrt", *ROCKCHIP)
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8", "int4")
