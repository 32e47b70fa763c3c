"""The configuration file (/etc/mcpd/mcpd.toml), parsed once into one immutable, typed object.

mcpd.schema does the checking: every key is typed, ranged and closed (unknown keys are errors), and
every problem is named by its key path. Every default here is documented in examples/mcpd.toml,
which a test keeps in step with this file.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from governors.params import PARAMETER_NAMES, GovernorParams
from mcpd.brokers import DEFAULT_PORT, Broker
from mcpd.brokers import parse as parse_broker
from mcpd.listen import tcp_address
from mcpd.schema import Check, Invalid, build, key_path
from safefs import NotAFile, open_regular
from sensors import cpulist
from sensors.discovery import PowerOptions

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 (JetPack 6)
    import tomli as tomllib

DEFAULT_PATH = Path("/etc/mcpd/mcpd.toml")
MAX_FILE_BYTES = 2**20
"""Far above any real config (the example is 8 KiB); a larger file is a mistake, not a config."""
MAX_NESTING = 16
"""Deeper than any key path of the config (models[0].rknn.inputs[0].shape[0] is 6 levels)."""
MAX_MODELS = 256
"""Models served at most: each has a slot for its batch size in the block the governor shares with
the serving process (mcpd.ipc.SLOTS), kept for the governor's lifetime."""


class ConfigError(Exception):
    """A configuration that cannot be used; `problems` name the file, key path and expectation."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {problem}" for problem in problems))


Ms = Annotated[int, Check(ge=10, le=60_000)]
Celsius = Annotated[float, Check(ge=-40, le=150)]
Watts = Annotated[float, Check(gt=0, le=2000)]
Mhz = Annotated[float, Check(gt=0, le=100_000)]
Name = Annotated[str, Check(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$", max_length=128)]
Bytes = Annotated[int, Check(ge=1024, le=2**34)]
Timeout = Annotated[int, Check(ge=100, le=3_600_000)]


@dataclass(frozen=True)
class DaemonSection:
    sysfs_root: str = "/"
    socket: str = "/run/mcpd/mcpd.sock"
    socket_group: str = ""
    state_dir: str = "/var/lib/mcpd"
    runtime_dir: str = "/run/mcpd"
    max_request_bytes: Bytes = 64 * 2**20
    max_json_bytes: Bytes = 256 * 2**10
    max_json_output_bytes: Bytes = 16 * 2**20
    max_inflight_bytes: Annotated[int, Check(ge=1024, le=2**36)] = 256 * 2**20
    max_connections: Annotated[int, Check(ge=1, le=1_000_000)] = 256
    header_timeout_ms: Timeout = 10_000
    body_timeout_ms: Timeout = 30_000
    send_timeout_ms: Timeout = 10_000
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    placement: Literal["auto", "off"] = "auto"


def _loopback_unless_allowed(
    key: str, text: str, allowed: bool, allow_key: str, exposed: str
) -> None:
    """A TCP listener's HOST:PORT, refused off loopback unless `allow_key` says so: there is no
    authentication, so every host that can reach it could do what `exposed` says."""
    if not text:
        return
    try:
        address = tcp_address(text)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None
    if not address.loopback and not allowed:
        raise ValueError(
            f"{key} = {text!r} is not a loopback address: every host that can reach it could "
            f"{exposed}; use 127.0.0.1 or [::1], or set {allow_key} = true"
        )


@dataclass(frozen=True)
class ServingSection:
    # A TCP listener for clients that cannot use a Unix socket (perf_analyzer): off by default,
    # and on a loopback address unless remote clients are allowed in so many words.
    http: str = ""
    allow_remote_http: bool = False

    def __post_init__(self) -> None:
        _loopback_unless_allowed(
            "http", self.http, self.allow_remote_http, "allow_remote_http", "run the models"
        )


@dataclass(frozen=True)
class MetricsSection:
    # A TCP port that serves only /metrics, for the node's Prometheus: off by default, and on a
    # loopback address unless remote scrapers are allowed in so many words.
    listen: str = ""
    allow_remote: bool = False

    def __post_init__(self) -> None:
        _loopback_unless_allowed(
            "listen", self.listen, self.allow_remote, "allow_remote", "read the board's metrics"
        )


@dataclass(frozen=True)
class SamplingSection:
    temperature_ms: Ms = 200
    power_ms: Ms = 100
    stale_ms: Annotated[int, Check(ge=100, le=60_000)] = 1000


@dataclass(frozen=True)
class SensorsSection:
    governing_temperatures: tuple[str, ...] = ()
    governing_powers: tuple[str, ...] = ()
    power: Literal["auto", "meter", "estimate"] = "auto"
    estimate_static_w: Watts = 4.0
    power_coefficients: dict[Name, Annotated[float, Check(gt=0, le=1_000_000)]] = field(
        default_factory=dict
    )

    def power_options(self) -> PowerOptions:
        return PowerOptions(self.power, self.estimate_static_w, dict(self.power_coefficients))


@dataclass(frozen=True)
class DomainSection:
    enabled: bool = True
    min_mhz: Mhz | None = None
    max_mhz: Mhz | None = None

    def __post_init__(self) -> None:
        if self.min_mhz is not None and self.max_mhz is not None and self.min_mhz >= self.max_mhz:
            raise ValueError("min_mhz must be below max_mhz")


@dataclass(frozen=True)
class CoolingSection:
    """[cooling]: the cooling's health (mcpd.governor.cooling_health): the drift of the thermal
    resistance from the board's baseline that warns once it has lasted `sustained_s`."""

    enabled: bool = True
    drift_warning: Annotated[float, Check(gt=1.0, le=4.0)] = 1.25
    sustained_s: Annotated[int, Check(ge=0, le=30 * 86400)] = 7200


PROFILE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
"""A governor profile's name, in the config and in the MQTT `profile` command."""
ProfileName = Annotated[str, Check(pattern=PROFILE_NAME_PATTERN)]
DownFactor = Annotated[float, Check(gt=0, lt=1)]
UpFactor = Annotated[float, Check(gt=1, le=4)]
HoldMs = Annotated[int, Check(ge=0, le=600_000)]


_DEFAULT = GovernorParams()


@dataclass(frozen=True)
class GovernorProfile:
    """A named set of overrides of the [governor] thresholds, switchable at run time."""

    temp_high_c: Celsius | None = None
    temp_low_c: Celsius | None = None
    power_high_w: Watts | None = None
    power_low_w: Watts | None = None
    down_factor: DownFactor | None = None
    up_factor: UpFactor | None = None
    min_mhz: Mhz | None = None
    max_mhz: Mhz | None = None
    raise_hold_ms: HoldMs | None = None

    def overrides(self) -> dict[str, Any]:
        """The values it sets."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {name: value for name, value in values.items() if value is not None}


@dataclass(frozen=True)
class GovernorSection:
    """[governor]: the governor's parameters (governors.GovernorParams, defaults from there), its
    policy, per-domain ranges and profiles."""

    temp_high_c: Celsius = _DEFAULT.temp_high_c
    temp_low_c: Celsius = _DEFAULT.temp_low_c
    power_high_w: Watts = _DEFAULT.power_high_w
    power_low_w: Watts = _DEFAULT.power_low_w
    down_factor: DownFactor = _DEFAULT.down_factor
    up_factor: UpFactor = _DEFAULT.up_factor
    min_mhz: Mhz = _DEFAULT.min_mhz
    max_mhz: Mhz = _DEFAULT.max_mhz
    raise_hold_ms: HoldMs = 0
    policy: Literal["hysteresis", "adaptive"] = "hysteresis"
    domains: dict[Name, DomainSection] = field(default_factory=dict)
    profile: ProfileName = "default"
    profiles: dict[ProfileName, GovernorProfile] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.params()  # a ValueError names what is misordered
        if self.profile != "default" and self.profile not in self.profiles:
            raise ValueError(f"profile {self.profile!r} is not defined in [governor.profiles]")
        if "default" in self.profiles:
            raise ValueError(
                "profiles.default: the name is taken by the [governor] values themselves"
            )
        for name, profile in self.profiles.items():
            overrides = profile.overrides()
            values = {key: overrides.get(key, getattr(self, key)) for key in PARAMETER_NAMES}
            try:
                GovernorParams(**values)
            except ValueError as exc:
                raise ValueError(f"profiles.{name}: {exc}") from None

    def params(self) -> GovernorParams:
        """The governor's parameters (raises ValueError when they are misordered)."""
        return GovernorParams(**{name: getattr(self, name) for name in PARAMETER_NAMES})

    def tuned(self, profile: str) -> GovernorSection:
        """These settings with a profile's overrides applied ("default": none)."""
        if profile == "default":
            return self
        chosen = self.profiles[profile]
        return dataclasses.replace(
            self, **chosen.overrides(), profile=profile, profiles={profile: chosen}
        )


@dataclass(frozen=True)
class OnnxRuntimeOptions:
    providers: tuple[Literal["tensorrt", "cuda", "cpu"], ...] = ("tensorrt", "cuda", "cpu")
    intra_op_threads: Annotated[int, Check(ge=0, le=256)] = 0
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"
    optimized_model_path: str = ""
    trt_cache_dir: str = ""
    trt_fp16: bool = False
    device_id: Annotated[int, Check(ge=0, le=64)] = 0


@dataclass(frozen=True)
class RknnInput:
    name: Name
    datatype: Literal["UINT8", "INT8", "INT16", "FP16", "FP32"]
    shape: Annotated[tuple[Annotated[int, Check(ge=1, le=2**31)], ...], Check(min_items=1)]


@dataclass(frozen=True)
class RknnOptions:
    core_mask: Literal["auto", "0", "1", "2", "0_1", "0_1_2", "all"] = "auto"
    # RKNNLite has no call that describes a model's inputs (only load, init, inference, release),
    # so they are declared here; the outputs are learned from a warm-up inference.
    inputs: tuple[RknnInput, ...] = ()
    data_format: Literal["nhwc", "nchw"] = "nhwc"


@dataclass(frozen=True)
class OpenVinoOptions:
    # OpenVINO's device name: CPU is tested; GPU (GPU.1 for a second one), NPU and AUTO are passed
    # to OpenVINO as they are, untested on hardware (README, "Models and backends").
    device: Annotated[str, Check(pattern=r"^(CPU|GPU(\.[0-9]{1,2})?|NPU|AUTO)$")] = "CPU"
    # OpenVINO's inference precision hint; "auto" leaves OpenVINO's default (bf16 on CPUs with
    # AMX, f32 on the others), unless the model file carries one (mcpd.serving.backends.openvino).
    precision: Literal["auto", "f32", "bf16", "f16"] = "auto"
    threads: Annotated[int, Check(ge=0, le=256)] = 0
    # OpenVINO's streams (CPU): each runs a batch of its own on its share of the threads, and the
    # model's worker keeps that many batches in flight. 1 puts every thread on each batch (lowest
    # latency); more trade a request's latency for throughput under load (docs/openvino.md §2).
    streams: Annotated[int, Check(ge=1, le=256)] = 1


BatchSize = Annotated[int, Check(ge=1, le=4096)]
CpuList = Annotated[str, Check(pattern=r"([0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*)?", max_length=1024)]
"""CPUs in the kernel's list format ("4-7", "0,2,4-5"; sensors/cpulist.py); "" for none."""

EXTENSIONS = {".onnx": "onnxruntime", ".ort": "onnxruntime", ".rknn": "rknn", ".xml": "openvino"}
"""The backend that serves a model file by its extension, where `backend = "auto"`."""


@dataclass(frozen=True)
class ModelSection:
    name: Name
    path: str
    backend: Literal["auto", "onnxruntime", "rknn", "openvino"] = "auto"
    max_batch: BatchSize = 8
    max_queue_delay_ms: Annotated[float, Check(ge=0, le=10_000)] = 2.0
    preferred_batch_sizes: tuple[BatchSize, ...] = ()
    max_queue_size: Annotated[int, Check(ge=1, le=1_000_000)] = 256
    timeout_ms: Annotated[int, Check(ge=0, le=3_600_000)] = 0
    onnxruntime: OnnxRuntimeOptions = OnnxRuntimeOptions()
    rknn: RknnOptions = RknnOptions()
    openvino: OpenVinoOptions = OpenVinoOptions()
    # `mcpd optimize` in the background (ONNX models): the original serves meanwhile.
    optimize: Literal["off", "auto", "fp32", "bf16", "fp16", "int8", "int4"] = "off"
    min_cosine: Annotated[float, Check(ge=0, le=1)] = 0.98
    calibration: str = ""
    # Where its threads run, instead of the placement plan's share of the fastest cores.
    cpus: CpuList = ""

    def __post_init__(self) -> None:
        if self.cpus and cpulist.parse(self.cpus) is None:
            raise ValueError(
                f"cpus = {self.cpus!r}: a range runs backwards or past CPU {cpulist.MAX_CPU}"
            )
        too_big = [size for size in self.preferred_batch_sizes if size > self.max_batch]
        if too_big:
            raise ValueError(f"preferred_batch_sizes {too_big} exceed max_batch {self.max_batch}")
        if self.optimize != "off" and not self.calibration:
            raise ValueError(
                f"optimize = {self.optimize!r} needs calibration (a folder of samples)"
            )
        served_by = self.served_by()
        changed = _changed_keys(self.openvino)
        # With backend "auto", `mcpd optimize` may pick an OpenVINO build of a model onnxruntime
        # serves (measured on the CPU), which this table then configures.
        may_serve_openvino = (
            self.optimize != "off" and self.backend == "auto" and served_by == "onnxruntime"
        )
        if may_serve_openvino and self.openvino.device != "CPU":
            raise ValueError(
                f'openvino.device = {self.openvino.device!r}: with backend "auto", mcpd '
                'optimize measures OpenVINO on the CPU; set backend = "openvino" to optimize and '
                f"serve on {self.openvino.device}"
            )
        if changed and served_by not in (None, "openvino") and not may_serve_openvino:
            # A table that is never read is a mistake: most likely `backend` was left out.
            how = "backend" if self.backend != "auto" else f"its extension {self.suffix!r}"
            raise ValueError(
                f"openvino.{changed[0]} = {getattr(self.openvino, changed[0])!r} is for the "
                f"openvino backend, but this model is served by {served_by} (by {how}); "
                'set backend = "openvino" or remove it'
            )

    @property
    def suffix(self) -> str:
        return Path(self.path).suffix.lower()

    def served_by(self) -> str | None:
        """The backend that serves the file: `backend`, else the one of its extension (None for an
        extension no backend has, which the serving process reports when it loads the model)."""
        return self.backend if self.backend != "auto" else EXTENSIONS.get(self.suffix)


def _changed_keys(options: OpenVinoOptions) -> list[str]:
    """The keys of the table that are set to something other than their default."""
    return [f.name for f in dataclasses.fields(options) if getattr(options, f.name) != f.default]


@dataclass(frozen=True)
class TlsSection:
    enabled: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""


# One or more topic levels: no wildcards, no NUL, no empty level, no leading or trailing "/".
TopicPrefix = Annotated[str, Check(pattern=r"^[^#+/\x00]+(/[^#+/\x00]+)*$", max_length=128)]


@dataclass(frozen=True)
class MqttSection:
    enabled: bool = False
    # One broker (host, port: localhost:1883 when neither is set), or `brokers`, never both.
    host: str | None = None
    port: Annotated[int, Check(ge=1, le=65535)] | None = None
    brokers: tuple[str, ...] = ()
    protocol: Literal["5", "3.1.1"] = "5"
    # One topic level that Home Assistant also accepts in its object ids.
    device_id: Annotated[str, Check(pattern=r"^[A-Za-z0-9_-]*$", max_length=64)] = ""
    topic_prefix: TopicPrefix = "mcpd"
    telemetry_ms: Annotated[int, Check(ge=100, le=3_600_000)] = 1000
    qos: Literal[0, 1, 2] = 1
    spool_messages: Annotated[int, Check(ge=10, le=10_000_000)] = 10_000
    message_expiry_s: Annotated[int, Check(ge=0, le=2**32 - 1)] = 3600
    keepalive_s: Annotated[int, Check(ge=5, le=3600)] = 30
    reconnect_max_s: Annotated[int, Check(ge=1, le=3600)] = 60
    username: str = ""
    password_file: str = ""
    tls: TlsSection = TlsSection()
    homeassistant_discovery: bool = False
    homeassistant_prefix: TopicPrefix = "homeassistant"
    commands_enabled: bool = False
    heartbeat_s: Annotated[int, Check(ge=1, le=86_400)] = 30

    def __post_init__(self) -> None:
        if self.brokers and (self.host is not None or self.port is not None):
            raise ValueError("brokers and host/port are both set: list every broker in brokers")
        for index, text in enumerate(self.brokers):
            try:
                parse_broker(text)
            except ValueError as exc:
                raise ValueError(f"brokers[{index}]: {exc}") from None
        # MQTT 3.1.1 has no password without a user name (MQTT-3.1.2-22).
        if self.password_file and not self.username:
            raise ValueError("password_file needs a username")
        if self.tls.key_file and not self.tls.cert_file:
            raise ValueError("tls.key_file needs a tls.cert_file")

    def addresses(self) -> tuple[Broker, ...]:
        """The brokers, as configured: `brokers`, else `host`/`port` as a list of one."""
        if self.brokers:
            return tuple(parse_broker(text) for text in self.brokers)
        port = DEFAULT_PORT if self.port is None else self.port
        return (Broker(self.host or "localhost", port),)


@dataclass(frozen=True)
class Config:
    daemon: DaemonSection = DaemonSection()
    sampling: SamplingSection = SamplingSection()
    sensors: SensorsSection = SensorsSection()
    governor: GovernorSection = field(default_factory=GovernorSection)
    cooling: CoolingSection = CoolingSection()
    models: tuple[ModelSection, ...] = ()
    mqtt: MqttSection = MqttSection()
    serving: ServingSection = ServingSection()
    metrics: MetricsSection = MetricsSection()

    def __post_init__(self) -> None:
        if len(self.models) > MAX_MODELS:
            raise ValueError(
                f"{len(self.models)} [[models]] tables: at most {MAX_MODELS} are served "
                f"(each takes one of the {MAX_MODELS} batch-size slots the governor shares with "
                "the serving process)"
            )
        names = [model.name for model in self.models]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"model names must be unique; repeated: {', '.join(duplicates)}")


def tcp_listeners(config: Config) -> dict[str, tuple[str, str]]:
    """The TCP listeners the configuration asks for: role -> (HOST:PORT, the key that sets it).
    `http` serves the whole protocol, `metrics` only /metrics."""
    wanted = {
        "http": (config.serving.http, "[serving] http"),
        "metrics": (config.metrics.listen, "[metrics] listen"),
    }
    return {role: setting for role, setting in wanted.items() if setting[0]}


def _too_deep(data: dict[str, Any]) -> str | None:
    """The key path of the first value nested deeper than MAX_NESTING, if any (the checker's
    error reports are then never exposed to it)."""
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(data, ())]
    while stack:
        value, loc = stack.pop()
        if len(loc) > MAX_NESTING:
            return key_path(loc)
        if isinstance(value, dict):
            stack.extend((item, (*loc, str(key))) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, (*loc, index)) for index, item in enumerate(value))
    return None


def parse(data: dict[str, Any], source: str = "<config>") -> Config:
    deep = _too_deep(data)
    if deep is not None:
        raise ConfigError(source, [f"{deep}: nested deeper than {MAX_NESTING} levels"])
    try:
        return build(Config, data)
    except Invalid as exc:
        raise ConfigError(source, exc.problems) from None


def _read_text(path: Path) -> str:
    """The file's text, refused with a ConfigError unless it is a regular file of UTF-8 text of a
    sane size. Opened non-blocking, so that a FIFO in its place cannot hang a reload."""
    source = str(path)
    try:
        fd = open_regular(path)
    except NotAFile as exc:
        raise ConfigError(source, [str(exc)]) from None
    except OSError as exc:
        raise ConfigError(source, [f"cannot read: {exc.strerror}"]) from None
    try:
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(source, [f"cannot read: {exc.strerror}"]) from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(source, [f"larger than {MAX_FILE_BYTES} bytes: not a config file"])
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(
            source, ["UTF-16 text (it starts with a byte-order mark); save it as UTF-8"]
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source, [f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}"]
        ) from None


def model_file_problems(config: Config) -> list[str]:
    """What `mcpd check-config` finds wrong with the model files themselves. Not part of `load`:
    the daemon reports a model that fails to load and serves the others."""
    found = []
    for index, model in enumerate(config.models):
        files = [model.path]
        if model.suffix == ".xml":  # an OpenVINO IR: its weights are the .bin beside it
            files.append(str(Path(model.path).with_suffix(".bin")))
        for file in files:
            try:
                os.close(open_regular(file))
            except NotAFile as exc:
                found.append(f"models[{index}].path: {file}: {exc}")
            except OSError as exc:
                found.append(f"models[{index}].path: cannot read {file}: {exc.strerror}")
    return found


def load(path: str | Path) -> Config:
    """Read and validate a config file. Relative model paths are taken from the file's folder.

    Anything wrong with the file, hostile or not, is a ConfigError naming it: a reload must never
    take the daemon down.
    """
    path = Path(path)
    text = _read_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [f"not valid TOML: {exc}"]) from None
    except RecursionError:
        raise ConfigError(str(path), ["not usable TOML: nested too deeply"]) from None
    except ValueError as exc:  # Python's int() refuses numbers of more than 4 300 digits
        raise ConfigError(str(path), [f"not usable TOML: {str(exc).split(';')[0]}"]) from None
    config = parse(data, str(path))

    def beside_the_file(value: str) -> str:
        return str(path.parent / value) if value and not Path(value).is_absolute() else value

    models = tuple(
        dataclasses.replace(
            model, path=beside_the_file(model.path), calibration=beside_the_file(model.calibration)
        )
        for model in config.models
    )
    return dataclasses.replace(config, models=models)
