"""What a search found: each candidate measured, the steps it skipped and why, the choice."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mcpd.optimize.layers import Layer
from mcpd.optimize.measure import Accuracy
from mcpd.optimize.sensitivity import Sensitivity


@dataclass(frozen=True)
class Candidate:
    label: str
    precision: str
    path: Path
    latency_ms: float | None  # None: not measurable here (GPU targets)
    accuracy: Accuracy
    accepted: bool
    fp32_nodes: tuple[str, ...] = ()
    layers: tuple[Layer, ...] | None = None  # rknn-toolkit2's per-layer analysis, when asked
    runtime: str = "onnxruntime"  # what runs it: onnxruntime, openvino or rknn
    seconds: float | None = None  # building and measuring it


@dataclass(frozen=True)
class Skipped:
    """A step not taken because it could not win (plan.could_win) or the budget was spent."""

    label: str
    reason: str
    speedup: float | None = None  # how fast it was found to run, where that was measured


@dataclass(frozen=True)
class Outcome:
    reference_ms: float | None
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    sensitivity: tuple[Sensitivity, ...]
    skipped: tuple[Skipped, ...] = ()
