"""The config file: one typed object; every mistake named by file, key path and expectation."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mcpd import config, ipc, schema
from tests.conftest import PROJECT
from tests.support.configs import HOSTILE

EXAMPLE = PROJECT / "examples/mcpd.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mcpd.toml"
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, text)
    with pytest.raises(config.ConfigError) as info:
        config.load(path)
    assert info.value.source == str(path)
    return info.value.problems


def test_example_is_exactly_the_defaults() -> None:
    assert config.load(EXAMPLE) == config.Config()


def _keys(section: type, prefix: str = "") -> list[str]:
    keys = []
    for name, annotation in schema.hints(section).items():
        nested = [
            a
            for a in (annotation, *getattr(annotation, "__args__", ()))
            if isinstance(a, type) and dataclasses.is_dataclass(a)
        ]
        if nested and name != "domains":
            keys += _keys(nested[0], f"{prefix}{name}.")
        keys.append(f"{prefix}{name}")
    return keys


def test_example_documents_every_key() -> None:
    text = EXAMPLE.read_text()
    sections = set(re.findall(r"^#?\s*\[+([\w.]+)\]+", text, re.MULTILINE))
    for key in _keys(config.Config):
        section, _, name = key.rpartition(".")
        if section.startswith("models."):
            section = "models." + section.split(".", 1)[1]
        assert section in sections | {""} or section.startswith("models"), key
        assert re.search(rf"^#?\s*{name}\s*=|^#?\s*\[+{re.escape(key)}\]+", text, re.MULTILINE), (
            f"{key} not documented"
        )


def test_defaults_match_the_brief() -> None:
    c = config.Config()
    assert (c.daemon.sysfs_root, c.sampling.temperature_ms, c.sampling.power_ms) == ("/", 200, 100)
    g = c.governor
    assert (g.temp_high_c, g.temp_low_c, g.power_high_w, g.power_low_w) == (85.0, 75.0, 12.0, 9.0)
    assert (g.down_factor, g.up_factor, g.min_mhz, g.max_mhz, g.raise_hold_ms) == (
        0.7,
        1.15,
        800.0,
        3200.0,
        0,
    )


def test_governor_policy_is_one_of_two(tmp_path: Path) -> None:
    assert config.load(write(tmp_path, '[governor]\npolicy = "adaptive"\n')).governor.policy == (
        "adaptive"
    )
    (problem,) = problems(tmp_path, '[governor]\npolicy = "pid"\n')
    assert problem == "governor.policy: expected 'hysteresis' or 'adaptive', got 'pid'"


def test_integer_where_float_expected_is_fine_but_not_the_reverse(tmp_path: Path) -> None:
    assert (
        config.load(write(tmp_path, "[governor]\ntemp_high_c = 90\n")).governor.temp_high_c == 90.0
    )
    (problem,) = problems(tmp_path, "[sampling]\npower_ms = 100.5\n")
    assert problem.startswith("sampling.power_ms: expected a valid integer")


def test_the_cooling_warning_is_a_rise_and_its_duration_a_time(tmp_path: Path) -> None:
    assert problems(tmp_path, "[cooling]\ndrift_warning = 1.0\nsustained_s = -60\n") == [
        "cooling.drift_warning: expected greater than 1, got 1.0",
        "cooling.sustained_s: expected greater than or equal to 0, got -60",
    ]
    (problem,) = problems(tmp_path, "[cooling]\nsustained_h = 2\n")
    assert problem.startswith(
        "cooling.sustained_h: unknown key; expected one of: enabled, drift_warning, sustained_s"
    )
    loaded = config.load(write(tmp_path, "[cooling]\ndrift_warning = 1.5\nsustained_s = 600\n"))
    assert (loaded.cooling.enabled, loaded.cooling.drift_warning, loaded.cooling.sustained_s) == (
        True,
        1.5,
        600,
    )


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    found = problems(tmp_path, '[sampling]\npower_ms = 0\ntemperature_ms = "x"\n[mqtt]\nqos = 3\n')
    assert len(found) == 3
    assert any(p.startswith("mqtt.qos: expected 0, 1 or 2") for p in found)


def test_models_locations_use_indexes(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        '[[models]]\nname = "a"\npath = "a.onnx"\n[[models]]\npath = "b.onnx"\nmax_batch = 0\n',
    )
    assert set(found) == {
        "models[1].name: required key is missing",
        "models[1].max_batch: expected greater than or equal to 1, got 0",
    }


def test_openvino_settings_are_checked_and_only_taken_for_openvino(tmp_path: Path) -> None:
    model = '[[models]]\nname = "m"\npath = "m.{}"\n{}[models.openvino]\n{}\n'
    cfg = config.load(write(tmp_path, model.format("xml", "", 'device = "GPU.1"\nthreads = 2')))
    assert cfg.models[0].served_by() == "openvino"
    assert cfg.models[0].openvino == config.OpenVinoOptions(device="GPU.1", threads=2)
    onnx = model.format("onnx", 'backend = "openvino"\n', 'precision = "bf16"')
    assert config.load(write(tmp_path, onnx)).models[0].openvino.precision == "bf16"
    assert problems(tmp_path, model.format("xml", "", 'device = "TPU"\nprecision = "int8"')) == [
        "models[0].openvino.device: expected a string matching "
        "'^(CPU|GPU(\\.[0-9]{1,2})?|NPU|AUTO)$', got 'TPU'",
        "models[0].openvino.precision: expected 'auto', 'f32', 'bf16' or 'f16', got 'int8'",
    ]
    # A table that no backend reads is a mistake, named by its key.
    assert problems(tmp_path, model.format("onnx", "", 'precision = "f32"')) == [
        "models[0]: openvino.precision = 'f32' is for the openvino backend, but this model is "
        "served by onnxruntime (by its extension '.onnx'); set backend = \"openvino\" or remove it"
    ]
    explicit = model.format("xml", 'backend = "onnxruntime"\n', "threads = 4")
    assert problems(tmp_path, explicit) == [
        "models[0]: openvino.threads = 4 is for the openvino backend, but this model is served "
        'by onnxruntime (by backend); set backend = "openvino" or remove it'
    ]


def test_openvino_settings_of_a_model_optimize_may_build_for_openvino(tmp_path: Path) -> None:
    optimized = (
        '[[models]]\nname = "m"\npath = "m.onnx"\n{}optimize = "auto"\ncalibration = "c"\n'
        "[models.openvino]\n{}\n"
    )
    # backend "auto": the fastest build that passes serves, maybe an OpenVINO IR with this table.
    (model,) = config.load(write(tmp_path, optimized.format("", "threads = 2"))).models
    assert model.served_by() == "onnxruntime" and model.openvino.threads == 2
    # ... measured on the CPU, so another device must be asked for with the backend.
    assert problems(tmp_path, optimized.format("", 'device = "GPU"')) == [
        "models[0]: openvino.device = 'GPU': with backend \"auto\", mcpd optimize measures "
        'OpenVINO on the CPU; set backend = "openvino" to optimize and serve on GPU'
    ]
    explicit = 'backend = "openvino"\n'
    assert config.load(write(tmp_path, optimized.format(explicit, 'device = "GPU"'))).models
    # onnxruntime asked for: its builds alone, so the table is never read.
    assert problems(tmp_path, optimized.format('backend = "onnxruntime"\n', "threads = 2")) == [
        "models[0]: openvino.threads = 2 is for the openvino backend, but this model is served "
        'by onnxruntime (by backend); set backend = "openvino" or remove it'
    ]


def test_more_models_than_the_shared_slots_are_refused_naming_the_limit(tmp_path: Path) -> None:
    """Each model has one of the serving channel's batch-size slots (mcpd.ipc.SLOTS): 450 models
    used to start, and serving never got its configuration. `mcpd check-config` and a reload
    (both config.load) now refuse it, naming the limit; 256 load."""
    table = '[[models]]\nname = "m{}"\npath = "m.onnx"\n'
    (tmp_path / "m.onnx").write_bytes(b"")  # check-config looks at the files too
    path = write(tmp_path, "".join(table.format(i) for i in range(450)))
    result = subprocess.run(
        [sys.executable, "-m", "mcpd", "check-config", str(path)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr == (
        f"{path}: (top level): 450 [[models]] tables: at most 256 are served (each takes one of "
        "the 256 batch-size slots the governor shares with the serving process)\n"
    )
    assert config.MAX_MODELS == ipc.SLOTS == 256
    most = config.load(write(tmp_path, "".join(table.format(i) for i in range(256))))
    assert len(most.models) == 256


def test_model_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path, '[[models]]\nname = "m"\npath = "models/m.onnx"\n'))
    assert cfg.models[0].path == str(tmp_path / "models/m.onnx")


def test_toml_syntax_error(tmp_path: Path) -> None:
    (problem,) = problems(tmp_path, "[daemon\nsocket = 1\n")
    assert problem.startswith("not valid TOML:") and "line 1" in problem


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="cannot read: No such file"):
        config.load(tmp_path / "absent.toml")


def test_config_is_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.Config().governor.temp_high_c = 1.0  # type: ignore[misc]


def test_check_config_command(tmp_path: Path) -> None:
    good = subprocess.run(
        [sys.executable, "-m", "mcpd", "check-config", str(EXAMPLE)], capture_output=True, text=True
    )
    assert good.returncode == 0 and good.stdout.strip().endswith("OK")
    bad_file = write(tmp_path, "[governor]\nup_factor = 0.5\n")
    bad = subprocess.run(
        [sys.executable, "-m", "mcpd", "check-config", str(bad_file)],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert bad.stderr.strip() == f"{bad_file}: governor.up_factor: expected greater than 1, got 0.5"


def test_governor_profiles(tmp_path: Path) -> None:
    cfg = config.load(
        write(
            tmp_path,
            "[governor]\nprofile = 'quiet'\n[governor.profiles.quiet]\ntemp_high_c = 70.0\ntemp_low_c = 60.0\n",
        )
    )
    quiet = cfg.governor.tuned("quiet")
    assert (quiet.temp_high_c, quiet.temp_low_c, quiet.power_high_w) == (70.0, 60.0, 12.0)
    assert cfg.governor.tuned("default") == cfg.governor
    (problem,) = problems(tmp_path, "[governor]\nprofile = 'fast'\n")
    assert problem == "governor: profile 'fast' is not defined in [governor.profiles]"
    (problem,) = problems(tmp_path, "[governor.profiles.hot]\ntemp_low_c = 90.0\n")
    assert problem == "governor: profiles.hot: temp_low_c must be below temp_high_c"
    (problem,) = problems(tmp_path, "[governor.profiles.default]\ntemp_high_c = 90.0\n")
    assert problem.startswith("governor: profiles.default: the name is taken")
    (problem,) = problems(tmp_path, "[governor.profiles.Loud]\n")
    assert (
        problem
        == "governor.profiles.Loud: table name expected a string matching '^[a-z0-9][a-z0-9_-]{0,31}$'"
    )


def test_nesting_deeper_than_any_key_is_named() -> None:
    data = {"daemon": {"socket": [[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]}}
    with pytest.raises(config.ConfigError) as info:
        config.parse(data)
    assert info.value.problems == [
        f"daemon.socket{'[0]' * (config.MAX_NESTING - 1)}: nested deeper than {config.MAX_NESTING} levels"
    ]


@pytest.mark.parametrize("content", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_files_give_one_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "mcpd.toml"
    path.write_bytes(content)
    with pytest.raises(config.ConfigError) as info:
        config.load(path)
    assert info.value.source == str(path)
    assert all(len(problem) < 300 for problem in info.value.problems), info.value.problems


def test_a_file_too_big_to_be_a_config_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "mcpd.toml"
    with open(path, "wb") as file:
        file.truncate(3 * 2**30)  # sparse: 3 GiB that cost nothing
    assert problems_of(path) == [f"larger than {config.MAX_FILE_BYTES} bytes: not a config file"]


def problems_of(path: Path) -> list[str]:
    with pytest.raises(config.ConfigError) as info:
        config.load(path)
    return info.value.problems


def test_a_fifo_directory_or_symlink_loop_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    assert problems_of(fifo) == ["not a regular file (a FIFO)"]
    assert problems_of(tmp_path) == ["not a regular file (a directory)"]
    loop = tmp_path / "loop.toml"
    loop.symlink_to(loop)
    assert problems_of(loop) == ["cannot read: Too many levels of symbolic links"]


def test_a_symlink_to_a_config_is_followed(tmp_path: Path) -> None:
    real = write(tmp_path, "[governor]\ntemp_high_c = 90.0\n")
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    assert config.load(link).governor.temp_high_c == 90.0


@pytest.mark.parametrize("content", HOSTILE.values(), ids=HOSTILE.keys())
def test_check_config_prints_one_line_and_no_traceback(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "mcpd.toml"
    path.write_bytes(content)
    result = subprocess.run(
        [sys.executable, "-m", "mcpd", "check-config", str(path)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"{path}: ") and result.stderr.count("\n") == 1, result.stderr


def test_check_config_fails_on_a_missing_or_unreadable_model_file(tmp_path: Path) -> None:
    (tmp_path / "folder.onnx").mkdir()
    (tmp_path / "weightless.xml").write_text("<net/>")
    path = write(
        tmp_path,
        '[[models]]\nname = "a"\npath = "gone.onnx"\n'
        '[[models]]\nname = "b"\npath = "folder.onnx"\n'
        '[[models]]\nname = "c"\npath = "weightless.xml"\n',
    )
    result = subprocess.run(
        [sys.executable, "-m", "mcpd", "check-config", str(path)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"{path}: models[0].path: cannot read {tmp_path}/gone.onnx: No such file or directory",
        f"{path}: models[1].path: {tmp_path}/folder.onnx: not a regular file (a directory)",
        f"{path}: models[2].path: cannot read {tmp_path}/weightless.bin: No such file or directory",
    ]


def test_a_config_goes_to_serving_and_back_unchanged(tmp_path: Path) -> None:
    """The governor sends its config to the serving process as JSON; serving parses it again."""
    cfg = config.load(
        write(
            tmp_path,
            "[governor]\nprofile = 'quiet'\n[governor.profiles.quiet]\ntemp_high_c = 70.0\n"
            "temp_low_c = 60.0\n[governor.domains.policy0]\nmax_mhz = 1200\n"
            '[[models]]\nname = "npu"\npath = "m.rknn"\npreferred_batch_sizes = [1, 2]\n'
            '[[models.rknn.inputs]]\nname = "images"\ndatatype = "UINT8"\nshape = [1, 3]\n',
        )
    )
    sent = json.loads(json.dumps(dataclasses.asdict(cfg)))
    assert config.parse(sent) == cfg


ONE_PROBLEM = {
    "a wrong type names the key and the value": (
        '[governor]\ntemp_high_c = "hot"\n',
        "governor.temp_high_c: expected a valid number, got 'hot'",
    ),
    "out of range": (
        "[sampling]\npower_ms = 1\n",
        "sampling.power_ms: expected greater than or equal to 10, got 1",
    ),
    "a rule between keys": (
        "[governor]\ntemp_low_c = 90.0\n",
        "governor: temp_low_c must be below temp_high_c",
    ),
    "a rule between keys of a domain": (
        '[governor.domains."policy0"]\nmin_mhz = 2000.0\nmax_mhz = 1000.0\n',
        "governor.domains.policy0: min_mhz must be below max_mhz",
    ),
    "duplicate model names": (
        '[[models]]\nname = "a"\npath = "x"\n[[models]]\nname = "a"\npath = "y"\n',
        "(top level): model names must be unique; repeated: a",
    ),
    "a boolean is not a number": (
        "[governor]\ntemp_high_c = true\n",
        "governor.temp_high_c: expected a valid number, got True",
    ),
    "a number is not a string": (
        "[daemon]\nsocket = 5\n",
        "daemon.socket: expected a valid string, got 5",
    ),
    "a string is not a boolean": (
        '[mqtt]\nenabled = "yes"\n',
        "mqtt.enabled: expected a valid boolean, got 'yes'",
    ),
    "a literal is matched by type": (
        '[mqtt]\nqos = "1"\n',
        "mqtt.qos: expected 0, 1 or 2, got '1'",
    ),
    "a section is a table": ("daemon = 1\n", "daemon: expected a table, got 1"),
    "a list is a list": (
        '[sensors]\ngoverning_powers = "VDD_IN"\n',
        "sensors.governing_powers: expected a list, got 'VDD_IN'",
    ),
    "items are named by index": (
        '[sensors]\ngoverning_powers = ["a", 2]\n',
        "sensors.governing_powers[1]: expected a valid string, got 2",
    ),
    "strings have a length": (
        f'[mqtt]\ndevice_id = "{"a" * 65}"\n',
        f"mqtt.device_id: expected at most 64 characters, got '{'a' * 27}...{'a' * 28}'",
    ),
    "a pattern matches all of it": (
        '[mqtt]\ndevice_id = "a\\n"\n',
        "mqtt.device_id: expected a string matching '^[A-Za-z0-9_-]*$', got 'a\\n'",
    ),
    "a shape has a dimension": (
        '[[models]]\nname = "m"\npath = "m"\n[[models.rknn.inputs]]\nname = "x"\ndatatype = "UINT8"\nshape = []\n',
        "models[0].rknn.inputs[0].shape: expected at least 1 item, got []",
    ),
    "a domain name is checked": (
        '[governor.domains."a b"]\n',
        "governor.domains.a b: table name expected a string matching '^[A-Za-z0-9][A-Za-z0-9_.:-]*$'",
    ),
}


ONE_PROBLEM_BEGINNING = {
    "an unknown key lists the valid ones": (
        "[sampling]\ntemperature_msec = 100\n",
        "sampling.temperature_msec: unknown key; expected one of: temperature_ms, power_ms",
    ),
    "an unknown section": (
        "[sampler]\nx = 1\n",
        "sampler: unknown key; expected one of: daemon, sampling",
    ),
    "booleans are not numbers": ("[mqtt]\nport = true\n", "mqtt.port: expected a valid integer"),
}
"""Mistakes whose one problem goes on to list what a growing schema holds: its beginning is
checked."""


@pytest.mark.parametrize(("text", "expected"), ONE_PROBLEM.values(), ids=ONE_PROBLEM.keys())
def test_a_mistake_is_one_problem_naming_its_key(tmp_path: Path, text: str, expected: str) -> None:
    assert problems(tmp_path, text) == [expected]


@pytest.mark.parametrize(
    ("text", "beginning"), ONE_PROBLEM_BEGINNING.values(), ids=ONE_PROBLEM_BEGINNING.keys()
)
def test_a_mistake_is_one_problem_beginning_with_its_key(
    tmp_path: Path, text: str, beginning: str
) -> None:
    (problem,) = problems(tmp_path, text)
    assert problem.startswith(beginning)


def test_rules_between_keys_wait_for_the_keys_themselves(tmp_path: Path) -> None:
    """A section whose keys are wrong is not also blamed for their order."""
    found = problems(tmp_path, '[governor]\ntemp_low_c = 90.0\ntemp_high_c = "x"\n')
    assert found == ["governor.temp_high_c: expected a valid number, got 'x'"]


def test_unknown_and_missing_keys_deep_in_a_list(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        '[[models]]\nname = "m"\npath = "m"\n[[models.rknn.inputs]]\nname = "x"\nshape = [1]\n'
        "dtype = 1\n",
    )
    assert found == [
        "models[0].rknn.inputs[0].datatype: required key is missing",
        "models[0].rknn.inputs[0].dtype: unknown key; expected one of: name, datatype, shape",
    ]


def test_the_governor_modules_need_neither_pydantic_nor_psutil() -> None:
    """pydantic and psutil are 20 MB of the governor's 40 MB budget (BENCHMARKS.md);
    tests/governor/test_supervisor.py checks a running governor, this the modules that load the config."""
    code = (
        "import json, sys, mcpd.cli, mcpd.governor.daemon\n"
        "mcpd.config.load(sys.argv[1])\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLE)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = json.loads(done.stdout)
    assert "mcpd.schema" in loaded
    assert not [name for name in loaded if name.startswith(("pydantic", "psutil"))]
