"""OpenVINO as the tests find it here: its own default precision on this CPU, and a preamble that
blocks it as if it were not installed."""

from __future__ import annotations

import openvino

DEFAULT_PRECISION = openvino.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
"""OpenVINO's own default on this CPU: bf16 with AMX, f32 without."""


BLOCKED = "import sys; sys.modules['openvino'] = None  # as if it were not installed\n"
