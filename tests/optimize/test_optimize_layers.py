"""rknn-toolkit2's per-layer accuracy analysis (`mcpd optimize --target rk3588 --layer-analysis`).

The files in tests/rknn_analysis/ are error_analysis.txt files as rknn-toolkit2 2.5.0 (PyPI,
x86_64) wrote them, byte for byte, with `RKNN.accuracy_analysis(inputs=[...], output_dir=...)` in
its simulator (no target) after `build()`:

- cnn-int8.txt: tests/optimize_models.cnn, INT8 `normal`, one of its cnn_samples (Conv rows
  fused into the Relu after them have no figures);
- outlier-int8.txt, outlier-int8-wide.txt: tests/optimize_models.outlier, INT8 `normal`, two
  random N(0,1) samples: the final MatMul's INT8 output is all zeros (`q_zero`), and in the second
  the 10⁴-scaled layer's Euclidean distance (1519.79504) is wider than its column and runs into
  the next cosine;
- two-inputs-int8-0.txt, two-inputs-int8-1.txt (two samples), two-inputs-fp16.txt: a two-input
  model (a + b, a MatMul with a 91-character output name, and a Relu of (a + b − 1000), all zero:
  `f_zero`).

The CLI tests run `mcpd optimize` end to end through mcpd's worker with tests/rknn_toolkit, a
stand-in for the toolkit that keeps its documented contract and writes these files (the real
toolkit: tests/optimize/test_optimize_rknn.py, opt-in)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from mcpd.cli import main
from mcpd.optimize import layers
from mcpd.optimize.interface import OptimizeError
from mcpd.optimize.layers import Layer
from tests.support import optimize_models as models

FIXTURES = Path(__file__).parent.parent / "rknn_analysis"
FAKE_TOOLKIT = Path(__file__).parent.parent / "rknn_toolkit"


def _parse(name: str) -> list[Layer]:
    return layers.parse((FIXTURES / name).read_text(), name)


def _by_name(found: list[Layer] | tuple[Layer, ...]) -> dict[str, Layer]:
    return {layer.name: layer for layer in found}


def test_every_row_with_figures_in_order_fused_rows_left_out() -> None:
    found = _parse("cnn-int8.txt")
    assert [layer.name for layer in found] == [
        "image",
        "image_int8",
        "relu4",
        "maxpool5",
        "relu9",
        "globalaveragepool10_2conv0",
        "globalaveragepool10",
        "gemm14_mm",
        "gemm14_mm__float16",
        "scores-rs",
        "scores",
    ]
    assert found[3] == Layer("MaxPool", "maxpool5", 0.99995, 0.50061, 0.99999, 0.28146)
    assert found[9].op_type == "exSoftmax13"


def test_a_distance_wider_than_its_column_is_split_from_the_next_cosine() -> None:
    loud = _by_name(_parse("outlier-int8-wide.txt"))["mul13-rs"]
    assert (loud.entire_cosine, loud.entire_euclidean) == (1.0, 1519.79504)
    assert (loud.single_cosine, loud.single_euclidean) == (1.0, 226.39894)


def test_markers_are_no_figure_and_a_zero_int8_output_ranks_worst() -> None:
    found = _parse("outlier-int8.txt")
    dead = _by_name(found)["matmul15_mm"]
    assert dead == Layer("Conv", "matmul15_mm", None, None, None, None, "q_zero")
    # Its own output is fine, only the accumulated one is zero: ranked by its own figure.
    tail = _by_name(found)["scores"]
    assert (tail.single_cosine, tail.entire_cosine, tail.note) == (0.99998, None, "q_zero")
    ranked = layers.worst_first(found)
    assert ranked[0] is dead and layers.broken(dead) and not layers.broken(tail)
    assert ranked[1].name == "relu8-rs"  # 0.99997, the lowest figure
    assert layers.describe(dead) == "[Conv] matmul15_mm (q_zero)"
    assert layers.describe(ranked[1]) == "[Relu] relu8-rs (cosine 0.99997)"


def test_an_all_zero_float_layer_ranks_last_and_long_names_are_whole() -> None:
    found = _parse("two-inputs-int8-0.txt")
    ranked = layers.worst_first(found)
    assert ranked[-1] == Layer("Relu", "zero-rs", None, None, None, None, "f_zero")
    long = ranked[0]
    assert long.name.startswith("/encoder/layers.0/") and long.name.endswith("_output_0_rs_sw")
    assert long.single_cosine == 0.99989


def test_combined_samples_keep_each_layers_worst_figures() -> None:
    first, second = _parse("two-inputs-int8-0.txt"), _parse("two-inputs-int8-1.txt")
    combined = layers.combine([first, second])
    assert [layer.name for layer in combined] == [layer.name for layer in first]
    add = _by_name(combined)["s-rs"]
    assert (add.entire_cosine, add.single_cosine) == (0.99998, 0.99998)  # the second sample's
    assert (add.entire_euclidean, add.single_euclidean) == (0.02047, 0.02047)
    relu = _by_name(combined)[
        "/encoder/layers.0/self_attention/output_projection/"
        "MatMul_with_a_really_long_name_output_0_rs_sw"
    ]
    assert (relu.single_cosine, relu.single_euclidean) == (0.99989, 0.02118)  # the first's
    assert _by_name(combined)["zero-rs"].note == "f_zero"


def test_a_layer_broken_in_one_sample_stays_broken_when_combined() -> None:
    broken = _parse("outlier-int8.txt")
    fine = layers.parse(
        (FIXTURES / "outlier-int8.txt")
        .read_text()
        .replace(" q_zero |  q_zero    q_zero |  q_zero", "0.99000 | 0.10000   0.99500 | 0.05000"),
        "edited",
    )
    assert _by_name(fine)["matmul15_mm"].single_cosine == 0.995
    for order in ([fine, broken], [broken, fine]):
        dead = _by_name(layers.combine(order))["matmul15_mm"]
        assert (dead.single_cosine, dead.note, dead.entire_cosine) == (None, "q_zero", 0.99)
        assert layers.worst_first(layers.combine(order))[0] == dead


BAD = {
    "empty": ("", "not rknn-toolkit2's accuracy analysis"),
    "no table": ("# simulator_error: ...\nlayer_name\n", "not rknn-toolkit2's accuracy analysis"),
    "header only": (
        (FIXTURES / "cnn-int8.txt").read_text().split("[Input]")[0],
        "no layer has figures",
    ),
    "garbled row": (
        (FIXTURES / "cnn-int8.txt").read_text().replace("0.99995 | 0.50061", "0.99995 | oops!"),
        "bad.txt line 13: not '[op] name' and two 'cos | euc' pairs ('[MaxPool] maxpool5",
    ),
    "one pair": (
        (FIXTURES / "cnn-int8.txt").read_text().replace("   0.99999 | 0.28146", ""),
        "bad.txt line 13:",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_what_is_not_the_toolkits_table_is_one_clear_error(case: str) -> None:
    text, message = BAD[case]
    with pytest.raises(OptimizeError) as raised:
        layers.parse(text, "bad.txt")
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_read_takes_each_samples_folder_and_refuses_a_symlink(tmp_path: Path) -> None:
    for index, name in enumerate(("two-inputs-int8-0.txt", "two-inputs-int8-1.txt")):
        (tmp_path / str(index)).mkdir()
        (tmp_path / str(index) / layers.FILE).write_bytes((FIXTURES / name).read_bytes())
    assert layers.read(tmp_path, 2) == layers.combine(
        [_parse("two-inputs-int8-0.txt"), _parse("two-inputs-int8-1.txt")]
    )
    with pytest.raises(OptimizeError, match=r"rknn-toolkit2 wrote no .*/2/error_analysis.txt"):
        layers.read(tmp_path, 3)
    (tmp_path / "1" / layers.FILE).unlink()
    (tmp_path / "1" / layers.FILE).symlink_to(FIXTURES / "cnn-int8.txt")
    with pytest.raises(OptimizeError, match=r"1/error_analysis.txt: cannot be read"):
        layers.read(tmp_path, 2)


# The CLI and its --json document, through the worker and the stand-in toolkit.


@pytest.fixture
def toolkit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `python` that imports the stand-in as `rknn.api`, set as MCPD_RKNN_PYTHON."""
    python = tmp_path / "toolkit" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nPYTHONPATH={FAKE_TOOLKIT} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("MCPD_RKNN_PYTHON", str(python))
    return python


def _optimize(tmp: Path, *flags: str) -> list[str]:
    model = models.outlier(tmp / "outlier.onnx")
    rng = np.random.default_rng(2)
    cal = models.npy_folder(tmp / "cal", [rng.normal(size=32).astype(np.float32) for _ in range(8)])
    return ["optimize", str(model), "--calibration", str(cal), "--out", str(tmp / "out"), *flags]


def test_json_layers_are_the_chosen_builds_worst_first(
    toolkit: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MCPD_FAKE_RKNN_ANALYSIS", str(FIXTURES / "outlier-int8.txt"))
    argv = _optimize(tmp_path, "--target", "rk3588", "--layer-analysis", "--json")
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["precision"] == "int8"  # the stand-in's simulator is exact
    assert doc["layers"][0] == {
        "name": "matmul15_mm",
        "op_type": "Conv",
        "single_cosine": None,
        "single_euclidean": None,
        "entire_cosine": None,
        "entire_euclidean": None,
        "note": "q_zero",
    }
    assert doc["layers"][1]["name"] == "relu8-rs" and doc["layers"][1]["single_cosine"] == 0.99997
    assert len(doc["layers"]) == 9  # every layer with figures (up to 10)
    (chosen,) = (c for c in doc["candidates"] if c["chosen"])
    assert chosen["layers"] == doc["layers"]


def test_table_shows_the_worst_layers_and_without_the_flag_there_are_none(
    toolkit: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MCPD_FAKE_RKNN_ANALYSIS", str(FIXTURES / "outlier-int8.txt"))
    assert main(_optimize(tmp_path, "--target", "rk3588", "--layer-analysis")) == 0
    table = capsys.readouterr().out.splitlines()
    at = table.index("worst layers of rknn int8 normal (single-layer cosine, entire, note):")
    assert table[at + 1].split() == ["[Conv]", "matmul15_mm", "-", "-", "q_zero"]
    assert table[at + 2].split() == ["[Relu]", "relu8-rs", "0.99997", "0.99996"]
    assert len(table) == at + 7  # five layers, then "wrote …"

    monkeypatch.setenv("MCPD_FAKE_RKNN_ANALYSIS", "fail")  # never called without the flag
    (tmp_path / "plain").mkdir()
    assert main(_optimize(tmp_path / "plain", "--target", "rk3588", "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["layers"] is None and all(c["layers"] is None for c in doc["candidates"])


@pytest.mark.parametrize(
    ("analysis", "message"),
    [
        ("fail", "rknn int8 normal: rknn-toolkit2 accuracy_analysis failed (return code -1)"),
        ("none", "rknn-toolkit2 wrote no "),
        (
            str(FIXTURES / "../optimize/test_optimize_layers.py"),
            "not rknn-toolkit2's accuracy analysis",
        ),
    ],
    ids=["fails", "writes nothing", "writes something else"],
)
def test_a_failed_or_unreadable_analysis_is_one_line_and_nothing_is_written(
    analysis: str,
    message: str,
    toolkit: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MCPD_FAKE_RKNN_ANALYSIS", analysis)
    argv = _optimize(tmp_path, "--target", "rk3588", "--layer-analysis", "--json")
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()[-1:]
    assert line.startswith("mcpd optimize: ") and message in line
    assert "Traceback" not in captured.err
    assert not (tmp_path / "out").exists()


def test_the_worker_keeps_only_each_samples_table(
    toolkit: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcpd.optimize import interface, rockchip, samples
    from mcpd.optimize.measure import outputs

    monkeypatch.setenv("MCPD_FAKE_RKNN_ANALYSIS", str(FIXTURES / "outlier-int8.txt"))
    args = _optimize(tmp_path)
    model = Path(args[1])
    spec = interface.interface(interface.load(model))
    calibration, validation = samples.split(samples.load(Path(args[3]), spec.inputs, None))
    work = tmp_path / "work"
    work.mkdir()
    built = rockchip.convert(
        model,
        spec,
        calibration,
        validation,
        outputs(model, validation),
        "rk3588",
        work,
        lambda accuracy: True,
        lambda line: None,
        toolkit,
        ("int8",),
        3,
    )
    assert [b.label for b in built] == ["rknn int8 normal"]  # 2 held-out samples: both analysed
    assert built[0].layers == layers.combine([_parse("outlier-int8.txt")] * 2)
    analysis = work / "analysis-int8-normal"
    left = sorted(p.relative_to(analysis).as_posix() for p in analysis.rglob("*"))
    assert left == ["0", "0/error_analysis.txt", "1", "1/error_analysis.txt"]
