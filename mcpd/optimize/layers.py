"""rknn-toolkit2's per-layer accuracy analysis read into mcpd's own form.

`RKNN.accuracy_analysis` (run by rknn_worker.py in the toolkit's simulator) writes one
`error_analysis.txt` per sample: a table with a row per layer of the converted model, comparing
its output with the float model's ('golden') by cosine and Euclidean distance, once for the
whole model up to that layer ('entire': errors accumulate) and once for the layer alone, fed the
golden inputs ('single'). The layout, the markers it writes where a figure is undefined and the
rows it leaves empty are in docs/optimizer.md ("rknn-toolkit2's per-layer accuracy analysis")."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import safefs
from mcpd.optimize.interface import OptimizeError

FILE = "error_analysis.txt"
FILE_LIMIT = 16 << 20  # a few hundred bytes a layer: far above any model's table
_RULE = re.compile(r"-{20,}")
_MARKER = r"[a-z][a-z_]*"  # 'nan', 'f_zero', 'q_zero': the toolkit could not compare
# Columns are fixed-width, so a wide Euclidean distance runs into the next cosine
# ('1519.795041.00000'): a cosine is one digit, a point and decimals, which is what splits them.
_COSINE = rf"-?\d\.\d+|{_MARKER}"
_DISTANCE = rf"\d+(?:\.\d+?)?(?:[eE][+-]?\d+)?|{_MARKER}"
_ROW = re.compile(
    r"\[(?P<op>[^\]]+)\] (?P<name>\S+)"
    rf"(?:\s+(?P<ec>{_COSINE})\s*\|\s*(?P<ee>{_DISTANCE})"
    rf"\s*(?P<sc>{_COSINE})\s*\|\s*(?P<se>{_DISTANCE}))?\s*"
)


@dataclass(frozen=True)
class Layer:
    """One layer of the converted model against the float model; a figure is None where the
    toolkit could not compute it, and `note` then holds the toolkit's marker for why."""

    op_type: str
    name: str
    entire_cosine: float | None
    entire_euclidean: float | None
    single_cosine: float | None
    single_euclidean: float | None
    note: str | None = None


def _figure(text: str) -> tuple[float | None, str | None]:
    """(value, None), or (None, the toolkit's marker) where it has no figure."""
    value = math.nan if re.fullmatch(_MARKER, text) else float(text)
    return (value, None) if math.isfinite(value) else (None, text)


def parse(text: str, source: str) -> list[Layer]:
    """Every layer with figures, in the file's order. Raises OptimizeError naming the file and
    line when the text is not the toolkit's simulator table."""
    lines = text.splitlines()
    rule = next((i for i, line in enumerate(lines) if _RULE.fullmatch(line.strip())), None)
    head = " ".join(lines[: rule or 0]).split()
    if rule is None or "simulator_error" not in head or head.count("cos") < 2:
        raise OptimizeError(f"{source}: not rknn-toolkit2's accuracy analysis (no simulator table)")
    layers = []
    for number, line in enumerate(lines[rule + 1 :], start=rule + 2):
        if not line.strip():
            continue
        row = _ROW.fullmatch(line)
        if row is None:
            raise OptimizeError(
                f"{source} line {number}: not '[op] name' and two 'cos | euc' pairs "
                f"({line.strip()[:60]!r})"
            )
        if row["ec"] is None:  # fused into the next layer (a Conv before its Relu): no figures
            continue
        # The layer's own figures first: their marker is the note.
        (sc, n1), (se, n2), (ec, n3), (ee, n4) = (_figure(row[k]) for k in ("sc", "se", "ec", "ee"))
        note = next((n for n in (n1, n2, n3, n4) if n), None)
        layers.append(Layer(row["op"], row["name"], ec, ee, sc, se, note))
    if not layers:
        raise OptimizeError(f"{source}: no layer has figures")
    return layers


def _worst(values: Iterable[float | None], pick: Callable[[list[float]], float]) -> float | None:
    known = [v for v in values if v is not None]
    return pick(known) if known else None


def combine(samples: Sequence[Sequence[Layer]]) -> tuple[Layer, ...]:
    """Each layer's worst figures over the samples (lowest cosine, largest distance), in the
    order layers first appear; a layer broken in one sample stays broken."""
    seen: dict[tuple[str, str], list[Layer]] = {}
    for layers in samples:
        for layer in layers:
            seen.setdefault((layer.op_type, layer.name), []).append(layer)
    return tuple(_merge(group) for group in seen.values())


def _merge(group: list[Layer]) -> Layer:
    worst = replace(
        group[0],
        entire_cosine=_worst((g.entire_cosine for g in group), min),
        entire_euclidean=_worst((g.entire_euclidean for g in group), max),
        single_cosine=_worst((g.single_cosine for g in group), min),
        single_euclidean=_worst((g.single_euclidean for g in group), max),
        note=next((g.note for g in group if g.note), None),
    )
    dead = next((g for g in group if broken(g)), None)
    return (
        worst
        if dead is None
        else replace(worst, single_cosine=None, single_euclidean=None, note=dead.note)
    )


def broken(layer: Layer) -> bool:
    """The converted layer's own output is degenerate where the float one is not (the toolkit's
    `q_…` markers, e.g. `q_zero`: docs/optimizer.md): worse than any figure."""
    return layer.single_cosine is None and (layer.note or "").startswith("q_")


def worst_first(layers: Iterable[Layer]) -> list[Layer]:
    """Broken layers, then by the error the layer adds itself (single cosine, lowest first),
    then by the error accumulated up to it; layers the toolkit could not compare otherwise (a
    float output of all zeros, `f_zero`) last."""

    def key(layer: Layer) -> tuple[bool, float, float]:
        single, entire = layer.single_cosine, layer.entire_cosine
        return (
            not broken(layer),
            math.inf if single is None else single,
            math.inf if entire is None else entire,
        )

    return sorted(layers, key=key)


def describe(layer: Layer) -> str:
    """`[Conv] conv8 (cosine 0.9512)`, or the toolkit's marker where it has no figure."""
    figure = layer.note if layer.single_cosine is None else f"cosine {layer.single_cosine:.5f}"
    return f"[{layer.op_type}] {layer.name} ({figure})"


def read(folder: Path, samples: int) -> tuple[Layer, ...]:
    """The analysis of `samples` samples, written by the toolkit under folder/0, folder/1, …"""
    tables = []
    for index in range(samples):
        path = folder / str(index) / FILE
        try:
            handle = safefs.open_folder(path.parent)
            try:
                data = safefs.read_file(handle, FILE, FILE_LIMIT)
            finally:
                os.close(handle)
        except FileNotFoundError:
            data = None
        except OSError as exc:
            raise OptimizeError(f"{path}: cannot be read ({exc.strerror})") from None
        if data is None:
            raise OptimizeError(f"rknn-toolkit2 wrote no {path}")
        tables.append(parse(data.decode("utf-8", "replace"), str(path)))
    return combine(tables)
