"""The configuration file (/etc/mcpd/mcpd.toml), parsed once into one immutable, typed object.

pydantic does the checking: every key is typed, ranged and closed (unknown keys are errors), and
its error locations become the key paths in our messages. Every default here is documented in
examples/mcpd.toml, which a test keeps in step with this file.
"""

from __future__ import annotations

import os
import reprlib
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from governors.params import PARAMETER_NAMES, GovernorParams
from mcpd.listen import tcp_address
from sensors.sysfs import NotAFile, open_regular

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 (JetPack 6)
    import tomli as tomllib

DEFAULT_PATH = Path("/etc/mcpd/mcpd.toml")
MAX_FILE_BYTES = 2**20
"""Far above any real config (the example is 8 KiB); a larger file is a mistake, not a config."""
MAX_NESTING = 16
"""Deeper than any key path of the config (models[0].rknn.inputs[0].shape[0] is 6 levels)."""


class ConfigError(Exception):
    """A configuration that cannot be used; `problems` name the file, key path and expectation."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {problem}" for problem in problems))


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Ms = Annotated[StrictInt, Field(ge=10, le=60_000)]
Celsius = Annotated[StrictFloat, Field(ge=-40, le=150)]
Watts = Annotated[StrictFloat, Field(gt=0, le=2000)]
Mhz = Annotated[StrictFloat, Field(gt=0, le=100_000)]
Name = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$", max_length=128)]


class DaemonSection(Section):
    sysfs_root: StrictStr = "/"
    socket: StrictStr = "/run/mcpd/mcpd.sock"
    socket_group: StrictStr = ""
    state_dir: StrictStr = "/var/lib/mcpd"
    runtime_dir: StrictStr = "/run/mcpd"
    max_request_bytes: Annotated[StrictInt, Field(ge=1024, le=2**34)] = 64 * 2**20
    max_json_bytes: Annotated[StrictInt, Field(ge=1024, le=2**34)] = 256 * 2**10
    max_inflight_bytes: Annotated[StrictInt, Field(ge=1024, le=2**36)] = 256 * 2**20
    max_connections: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = 256
    header_timeout_ms: Annotated[StrictInt, Field(ge=100, le=3_600_000)] = 10_000
    body_timeout_ms: Annotated[StrictInt, Field(ge=100, le=3_600_000)] = 30_000
    log_level: Literal["debug", "info", "warning", "error"] = "info"


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


class ServingSection(Section):
    # A TCP listener for clients that cannot use a Unix socket (perf_analyzer): off by default,
    # and on a loopback address unless remote clients are allowed in so many words.
    http: StrictStr = ""
    allow_remote_http: StrictBool = False

    @model_validator(mode="after")
    def _loopback(self) -> ServingSection:
        _loopback_unless_allowed(
            "http", self.http, self.allow_remote_http, "allow_remote_http", "run the models"
        )
        return self


class MetricsSection(Section):
    # A TCP port that serves only /metrics, for the node's Prometheus: off by default, and on a
    # loopback address unless remote scrapers are allowed in so many words.
    listen: StrictStr = ""
    allow_remote: StrictBool = False

    @model_validator(mode="after")
    def _loopback(self) -> MetricsSection:
        _loopback_unless_allowed(
            "listen", self.listen, self.allow_remote, "allow_remote", "read the board's metrics"
        )
        return self


class SamplingSection(Section):
    temperature_ms: Ms = 200
    power_ms: Ms = 100
    stale_ms: Annotated[StrictInt, Field(ge=100, le=60_000)] = 1000


class SensorsSection(Section):
    governing_temperatures: tuple[StrictStr, ...] = ()
    governing_powers: tuple[StrictStr, ...] = ()


class DomainSection(Section):
    enabled: StrictBool = True
    min_mhz: Mhz | None = None
    max_mhz: Mhz | None = None

    @model_validator(mode="after")
    def _ordered(self) -> DomainSection:
        if self.min_mhz is not None and self.max_mhz is not None and self.min_mhz >= self.max_mhz:
            raise ValueError("min_mhz must be below max_mhz")
        return self


PROFILE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
"""A governor profile's name, in the config and in the MQTT `profile` command."""
ProfileName = Annotated[StrictStr, Field(pattern=PROFILE_NAME_PATTERN)]


_DEFAULT = GovernorParams()


class GovernorProfile(Section):
    """A named set of overrides of the [governor] thresholds, switchable at run time."""

    temp_high_c: Celsius | None = None
    temp_low_c: Celsius | None = None
    power_high_w: Watts | None = None
    power_low_w: Watts | None = None
    down_factor: Annotated[StrictFloat, Field(gt=0, lt=1)] | None = None
    up_factor: Annotated[StrictFloat, Field(gt=1, le=4)] | None = None
    min_mhz: Mhz | None = None
    max_mhz: Mhz | None = None
    raise_hold_ms: Annotated[StrictInt, Field(ge=0, le=600_000)] | None = None


class GovernorSection(Section):
    """[governor]: the governor's parameters (governors.GovernorParams, defaults from there), its
    policy, per-domain ranges and profiles."""

    temp_high_c: Celsius = _DEFAULT.temp_high_c
    temp_low_c: Celsius = _DEFAULT.temp_low_c
    power_high_w: Watts = _DEFAULT.power_high_w
    power_low_w: Watts = _DEFAULT.power_low_w
    down_factor: Annotated[StrictFloat, Field(gt=0, lt=1)] = _DEFAULT.down_factor
    up_factor: Annotated[StrictFloat, Field(gt=1, le=4)] = _DEFAULT.up_factor
    min_mhz: Mhz = _DEFAULT.min_mhz
    max_mhz: Mhz = _DEFAULT.max_mhz
    raise_hold_ms: Annotated[StrictInt, Field(ge=0, le=600_000)] = 0
    policy: Literal["hysteresis", "adaptive"] = "hysteresis"
    domains: dict[Name, DomainSection] = {}
    profile: ProfileName = "default"
    profiles: dict[ProfileName, GovernorProfile] = {}

    @model_validator(mode="after")
    def _ordered(self) -> GovernorSection:
        self.params()  # a ValueError names what is misordered
        if self.profile != "default" and self.profile not in self.profiles:
            raise ValueError(f"profile {self.profile!r} is not defined in [governor.profiles]")
        if "default" in self.profiles:
            raise ValueError(
                "profiles.default: the name is taken by the [governor] values themselves"
            )
        for name in self.profiles:
            try:
                self.tuned(name).params()
            except ValueError as exc:
                raise ValueError(f"profiles.{name}: {exc}") from None
        return self

    def params(self) -> GovernorParams:
        """The governor's parameters (raises ValueError when they are misordered)."""
        return GovernorParams(**{name: getattr(self, name) for name in PARAMETER_NAMES})

    def tuned(self, profile: str) -> GovernorSection:
        """These settings with a profile's overrides applied ("default": none)."""
        if profile == "default":
            return self
        overrides = self.profiles[profile].model_dump(exclude_none=True)
        return self.model_copy(update=overrides)


class OnnxRuntimeOptions(Section):
    providers: tuple[Literal["tensorrt", "cuda", "cpu"], ...] = ("tensorrt", "cuda", "cpu")
    intra_op_threads: Annotated[StrictInt, Field(ge=0, le=256)] = 0
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"
    optimized_model_path: StrictStr = ""
    trt_cache_dir: StrictStr = ""
    trt_fp16: StrictBool = False
    device_id: Annotated[StrictInt, Field(ge=0, le=64)] = 0


class RknnInput(Section):
    name: Name
    datatype: Literal["UINT8", "INT8", "INT16", "FP16", "FP32"]
    shape: tuple[Annotated[StrictInt, Field(ge=1, le=2**31)], ...] = Field(min_length=1)


class RknnOptions(Section):
    core_mask: Literal["auto", "0", "1", "2", "0_1", "0_1_2", "all"] = "auto"
    # RKNNLite has no call that describes a model's inputs (only load, init, inference, release),
    # so they are declared here; the outputs are learned from a warm-up inference.
    inputs: tuple[RknnInput, ...] = ()
    data_format: Literal["nhwc", "nchw"] = "nhwc"


class ModelSection(Section):
    name: Name
    path: StrictStr
    backend: Literal["auto", "onnxruntime", "rknn"] = "auto"
    max_batch: Annotated[StrictInt, Field(ge=1, le=4096)] = 8
    max_queue_delay_ms: Annotated[StrictFloat, Field(ge=0, le=10_000)] = 2.0
    preferred_batch_sizes: tuple[Annotated[StrictInt, Field(ge=1, le=4096)], ...] = ()
    max_queue_size: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = 256
    timeout_ms: Annotated[StrictInt, Field(ge=0, le=3_600_000)] = 0
    onnxruntime: OnnxRuntimeOptions = OnnxRuntimeOptions()
    rknn: RknnOptions = RknnOptions()
    # `mcpd optimize` in the background (ONNX models): the original serves meanwhile.
    optimize: Literal["off", "auto", "fp32", "fp16", "int8", "int4"] = "off"
    min_cosine: Annotated[StrictFloat, Field(ge=0, le=1)] = 0.98
    calibration: StrictStr = ""

    @model_validator(mode="after")
    def _batch_sizes(self) -> ModelSection:
        too_big = [size for size in self.preferred_batch_sizes if size > self.max_batch]
        if too_big:
            raise ValueError(f"preferred_batch_sizes {too_big} exceed max_batch {self.max_batch}")
        if self.optimize != "off" and not self.calibration:
            raise ValueError(
                f"optimize = {self.optimize!r} needs calibration (a folder of samples)"
            )
        return self


class TlsSection(Section):
    enabled: StrictBool = False
    ca_file: StrictStr = ""
    cert_file: StrictStr = ""
    key_file: StrictStr = ""


# One or more topic levels: no wildcards, no NUL, no empty level, no leading or trailing "/".
TopicPrefix = Annotated[StrictStr, Field(pattern=r"^[^#+/\x00]+(/[^#+/\x00]+)*$", max_length=128)]


class MqttSection(Section):
    enabled: StrictBool = False
    host: StrictStr = "localhost"
    port: Annotated[StrictInt, Field(ge=1, le=65535)] = 1883
    protocol: Literal["5", "3.1.1"] = "5"
    # One topic level that Home Assistant also accepts in its object ids.
    device_id: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]*$", max_length=64)] = ""
    topic_prefix: TopicPrefix = "mcpd"
    telemetry_ms: Annotated[StrictInt, Field(ge=100, le=3_600_000)] = 1000
    qos: Literal[0, 1, 2] = 1
    spool_messages: Annotated[StrictInt, Field(ge=10, le=10_000_000)] = 10_000
    message_expiry_s: Annotated[StrictInt, Field(ge=0, le=2**32 - 1)] = 3600
    keepalive_s: Annotated[StrictInt, Field(ge=5, le=3600)] = 30
    reconnect_max_s: Annotated[StrictInt, Field(ge=1, le=3600)] = 60
    username: StrictStr = ""
    password_file: StrictStr = ""
    tls: TlsSection = TlsSection()
    homeassistant_discovery: StrictBool = False
    homeassistant_prefix: TopicPrefix = "homeassistant"
    commands_enabled: StrictBool = False

    @model_validator(mode="after")
    def _credentials(self) -> MqttSection:
        # MQTT 3.1.1 has no password without a user name (MQTT-3.1.2-22).
        if self.password_file and not self.username:
            raise ValueError("password_file needs a username")
        if self.tls.key_file and not self.tls.cert_file:
            raise ValueError("tls.key_file needs a tls.cert_file")
        return self


class Config(Section):
    daemon: DaemonSection = DaemonSection()
    sampling: SamplingSection = SamplingSection()
    sensors: SensorsSection = SensorsSection()
    governor: GovernorSection = GovernorSection()
    models: tuple[ModelSection, ...] = ()
    mqtt: MqttSection = MqttSection()
    serving: ServingSection = ServingSection()
    metrics: MetricsSection = MetricsSection()

    @model_validator(mode="after")
    def _unique_models(self) -> Config:
        names = [model.name for model in self.models]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"model names must be unique; repeated: {', '.join(duplicates)}")
        return self


def tcp_listeners(config: Config) -> dict[str, tuple[str, str]]:
    """The TCP listeners the configuration asks for: role -> (HOST:PORT, the key that sets it).
    `http` serves the whole protocol, `metrics` only /metrics."""
    wanted = {
        "http": (config.serving.http, "[serving] http"),
        "metrics": (config.metrics.listen, "[metrics] listen"),
    }
    return {role: setting for role, setting in wanted.items() if setting[0]}


def _key_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(top level)"


def _section_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The section class a location points into, to list its keys in an "unknown key" error."""
    model: Any = Config
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        annotation = field.annotation
        args = getattr(annotation, "__args__", ())
        candidates = [annotation, *args, *(getattr(arg, "__args__", ()) for arg in args)]
        model = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if model is None:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _describe(error: Any) -> str:
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        section = _section_at(loc[:-1])
        known = f"; expected one of: {', '.join(section.model_fields)}" if section else ""
        return f"{_key_path(loc)}: unknown key{known}"
    if kind == "missing":
        return f"{_key_path(loc)}: required key is missing"
    message = str(error["msg"])
    for pydantic_words, ours in _WORDING:
        message = message.replace(pydantic_words, ours)
    if kind == "value_error":
        return f"{_key_path(loc)}: {message}"
    if loc and loc[-1] == "[key]":  # a table name, e.g. [governor.profiles.NAME]
        return f"{_key_path(loc[:-1])}: table name {message}"
    return f"{_key_path(loc)}: {message}, got {_SHORT.repr(error.get('input'))}"


def _short_repr() -> reprlib.Repr:
    """Quotes what a key was given without echoing a 4 000-digit number or a 500-deep list whole
    (attributes, not keywords: Python 3.10 and 3.11 take none)."""
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxlong, short.maxother = 3, 60, 40, 60
    return short


_SHORT = _short_repr()

_WORDING = (
    ("Value error, ", ""),
    ("Input should be ", "expected "),
    ("String should match pattern", "expected a string matching"),
    ("String should have at most", "expected at most"),
)


def _too_deep(data: dict[str, Any]) -> str | None:
    """The key path of the first value nested deeper than MAX_NESTING, if any (pydantic's
    recursion and error reports are then never exposed to it)."""
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(data, ())]
    while stack:
        value, loc = stack.pop()
        if len(loc) > MAX_NESTING:
            return _key_path(loc)
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
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, [_describe(error) for error in exc.errors()]) from None


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
        try:
            os.close(open_regular(model.path))
        except NotAFile as exc:
            found.append(f"models[{index}].path: {model.path}: {exc}")
        except OSError as exc:
            found.append(f"models[{index}].path: cannot read {model.path}: {exc.strerror}")
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
    models = tuple(
        model.model_copy(
            update={
                key: str(path.parent / value)
                for key, value in (("path", model.path), ("calibration", model.calibration))
                if value and not Path(value).is_absolute()
            }
        )
        for model in config.models
    )
    return config.model_copy(update={"models": models})
