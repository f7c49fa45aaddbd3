"""Daemon settings: frozen dataclasses and their loading.

Precedence, highest first: command-line flags, ``STREAMD_*`` environment
variables, the TOML file, built-in defaults. Every setting has one TOML key
(``[section] key``), one flag and one environment variable, listed in
``SETTINGS``. This module must not import torch or websockets: ``device="auto"``
is resolved by the caller through :meth:`EngineConfig.resolved_device`.
"""
from __future__ import annotations

import argparse
import difflib
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomllib

from streamd.errors import ConfigError


DEFAULT_CONFIG_PATH = Path("/etc/streamd/streamd.toml")
ENV_PREFIX = "STREAMD_"
MAX_ENDPOINT_MS = 3_600_000

_DTYPE_ALIASES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "bf16": "bf16", "bfloat16": "bf16",
                  "fp16": "fp16", "float16": "fp16", "half": "fp16"}
TORCH_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")
BACKLOG_POLICIES = ("pace", "close")
ADMISSION_POLICIES = ("capacity", "max_streams")
_DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?")
_ORIGIN_RE = re.compile(r"(https?://[^/\s?#]+|null)")
_HOST_RE = re.compile(r"\*|(\*\.)?[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")


class _InvalidSetting(ConfigError):
    """One setting (``section.key``) failed validation; the loader adds where it came from."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting


def _require(ok: bool, setting: str, rule: str, value: object) -> None:
    if not ok:
        raise _InvalidSetting(setting, f"{setting} {rule}, got {value!r}")


def normalize_dtype(value: str) -> str:
    """Map ``fp32|bf16|fp16`` or a torch name (``bfloat16``...) to ``fp32|bf16|fp16``."""
    try:
        return _DTYPE_ALIASES[value.strip().lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {value!r}; use fp32, bf16 or fp16") from None


def normalize_device(value: str) -> str:
    """Validate ``auto``, ``cpu``, ``cuda`` or ``cuda:N``; ``cuda`` becomes ``cuda:0``."""
    device = value.strip().lower()
    if not _DEVICE_RE.fullmatch(device):
        raise ValueError(f"unknown device {value!r}; use auto, cpu or cuda:N")
    return "cuda:0" if device == "cuda" else device


def default_admin_socket(environ: Mapping[str, str]) -> Path:
    """``$RUNTIME_DIRECTORY/admin.sock`` under systemd, else ``$XDG_RUNTIME_DIR/streamd/``, else ``/run/streamd/``."""
    runtime = environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if runtime:
        return Path(runtime) / "admin.sock"
    xdg = environ.get("XDG_RUNTIME_DIR", "")
    base = Path(xdg) / "streamd" if xdg else Path("/run/streamd")
    return base / "admin.sock"


@dataclass(frozen=True)
class ServerConfig:
    """Websocket listener, limits and timeouts."""

    host: str = "127.0.0.1"
    port: int = 8765
    max_streams: int = 64
    max_message_bytes: int = 1 << 20
    max_backlog_s: float = 30.0
    backlog_policy: str = "pace"
    idle_timeout_s: float = 30.0
    max_session_s: float = 4 * 3600.0
    drain_timeout_s: float = 30.0
    handshake_timeout_s: float = 10.0
    send_timeout_s: float = 10.0
    tls_cert: Path | None = None
    tls_key: Path | None = None
    token_file: Path | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    workers: int = 0
    admission: str = "capacity"
    admission_utilization: float = 0.45
    resume_grace_s: float = 30.0
    utterance_limit_s: float = 120.0

    def __post_init__(self) -> None:
        _require(bool(self.host), "server.host", "must not be empty", self.host)
        _require(0 <= self.workers <= 256, "server.workers", "must be in 0..256", self.workers)
        _require(self.admission in ADMISSION_POLICIES, "server.admission", "must be capacity or max_streams",
                 self.admission)
        _require(0.05 <= self.admission_utilization <= 1, "server.admission_utilization", "must be in 0.05..1",
                 self.admission_utilization)
        _require(self.resume_grace_s >= 0, "server.resume_grace_s", "must not be negative", self.resume_grace_s)
        _require(0.08 <= self.utterance_limit_s <= MAX_ENDPOINT_MS / 1000, "server.utterance_limit_s",
                 f"must be in 0.08..{MAX_ENDPOINT_MS // 1000}", self.utterance_limit_s)
        _require(0 <= self.port <= 65535, "server.port", "must be in 0..65535", self.port)
        _require(self.max_streams >= 1, "server.max_streams", "must be at least 1", self.max_streams)
        _require(self.max_message_bytes >= 1024, "server.max_message_bytes", "must be at least 1024",
                 self.max_message_bytes)
        _require(self.max_backlog_s >= 1, "server.max_backlog_s", "must be at least 1", self.max_backlog_s)
        _require(self.backlog_policy in BACKLOG_POLICIES, "server.backlog_policy", "must be pace or close",
                 self.backlog_policy)
        _require(self.idle_timeout_s > 0, "server.idle_timeout_s", "must be positive", self.idle_timeout_s)
        _require(self.max_session_s > 0, "server.max_session_s", "must be positive", self.max_session_s)
        _require(self.drain_timeout_s >= 0, "server.drain_timeout_s", "must not be negative",
                 self.drain_timeout_s)
        _require(self.handshake_timeout_s > 0, "server.handshake_timeout_s", "must be positive",
                 self.handshake_timeout_s)
        _require(self.send_timeout_s > 0, "server.send_timeout_s", "must be positive", self.send_timeout_s)
        _require(self.tls_key is None or self.tls_cert is not None, "server.tls_key",
                 "needs server.tls_cert as well", str(self.tls_key))
        origins = tuple(o.strip().lower().rstrip("/") for o in self.allowed_origins)
        for origin in origins:
            _require(origin == "*" or bool(_ORIGIN_RE.fullmatch(origin)), "server.allowed_origins",
                     "must hold * or origins like https://example.com[:port]", origin)
        object.__setattr__(self, "allowed_origins", origins)
        hosts = tuple(h.strip().lower().rstrip(".") for h in self.allowed_hosts)
        for host in hosts:
            _require(bool(_HOST_RE.fullmatch(host)), "server.allowed_hosts",
                     "must hold * or host names like stt.example.com (no scheme, no port)", host)
        object.__setattr__(self, "allowed_hosts", hosts)


@dataclass(frozen=True)
class EngineConfig:
    """Model, placement and batching.

    ``right_context`` is the attention right context R in encoder frames
    (80 ms each): lookahead R*80 ms, chunk (R+1)*80 ms; None keeps the model's.
    """

    model: Path | None = None
    device: str = "auto"
    dtype: str = "fp32"
    right_context: int | None = None
    batch_wait_ms: int = 10
    gil_switch_ms: float = 0.5
    thread_cpu: int | None = None
    cuda_graphs: str = "on"

    def __post_init__(self) -> None:
        for key, normalize in (("device", normalize_device), ("dtype", normalize_dtype)):
            try:
                object.__setattr__(self, key, normalize(getattr(self, key)))
            except ValueError as err:
                raise _InvalidSetting(f"engine.{key}", f"engine.{key}: {err}") from None
        _require(self.right_context is None or self.right_context >= 0, "engine.right_context",
                 "must not be negative", self.right_context)
        _require(0 <= self.batch_wait_ms <= 1000, "engine.batch_wait_ms", "must be in 0..1000", self.batch_wait_ms)
        _require(0.01 <= self.gil_switch_ms <= 100, "engine.gil_switch_ms", "must be in 0.01..100",
                 self.gil_switch_ms)
        _require(self.cuda_graphs in ("on", "off"), "engine.cuda_graphs", "must be on or off", self.cuda_graphs)
        _require(self.thread_cpu is None or self.thread_cpu >= 0, "engine.thread_cpu", "must not be negative",
                 self.thread_cpu)

    @property
    def torch_dtype(self) -> str:
        """The torch attribute name of ``dtype`` (``getattr(torch, cfg.torch_dtype)``)."""
        return TORCH_DTYPE_NAMES[self.dtype]

    def resolved_device(self, cuda_available: bool) -> str:
        """The concrete device: ``auto`` becomes ``cuda:0`` or ``cpu``."""
        if self.device != "auto":
            return self.device
        return "cuda:0" if cuda_available else "cpu"


@dataclass(frozen=True)
class EndpointingConfig:
    """Server-wide endpoint rules in milliseconds; 0 disables a rule.

    See ``docs/protocol.md`` (Endpointing) and ``streamd.session.endpoint``.
    """

    silence_after_speech_ms: int = 800
    silence_without_speech_ms: int = 5000
    max_utterance_ms: int = 30_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            _require(0 <= value <= MAX_ENDPOINT_MS, f"endpointing.{f.name}", f"must be in 0..{MAX_ENDPOINT_MS}", value)

    @property
    def enabled(self) -> bool:
        """True when at least one rule is active."""
        return any(getattr(self, f.name) for f in fields(self))

    def capped(self, limit_ms: int) -> EndpointingConfig:
        """These rules with `max_utterance_ms` at most `limit_ms` (the server's `utterance_limit_s`,
        which no stream can switch off: 0 becomes the limit)."""
        if 0 < self.max_utterance_ms <= limit_ms:
            return self
        return EndpointingConfig(self.silence_after_speech_ms, self.silence_without_speech_ms, limit_ms)


@dataclass(frozen=True)
class GateConfig:
    """The speech gate: words only where the audio may hold speech (``streamd.audio.activity``).

    A 20 ms frame may hold speech when its level in the speech band is at least ``min_dbfs`` and at
    least ``rise_db`` above the quietest frame of the 1.5 s before it; a word counts only within a
    second of such a frame.
    """

    mode: str = "on"
    min_dbfs: float = -70.0
    rise_db: float = 9.0

    def __post_init__(self) -> None:
        _require(self.mode in ("on", "off"), "gate.mode", "must be on or off", self.mode)
        _require(-200 <= self.min_dbfs <= 0, "gate.min_dbfs", "must be in -200..0", self.min_dbfs)
        _require(0 <= self.rise_db <= 60, "gate.rise_db", "must be in 0..60", self.rise_db)


@dataclass(frozen=True)
class AdminConfig:
    """Admin control plane: a unix socket (None = off) and optional token-protected TCP."""

    socket: Path | None = Path("/run/streamd/admin.sock")
    host: str = "127.0.0.1"
    port: int | None = None
    token_file: Path | None = None

    def __post_init__(self) -> None:
        _require(self.port is None or 1 <= self.port <= 65535, "admin.port", "must be in 1..65535", self.port)
        _require(self.port is None or self.token_file is not None, "admin.token_file",
                 "is required when admin.port is set", None)


@dataclass(frozen=True)
class LogConfig:
    """Log level, line format and the per-stream access lines."""

    level: str = "info"
    format: str = "text"
    access: str = "on"

    def __post_init__(self) -> None:
        object.__setattr__(self, "level", self.level.lower())
        _require(self.level in LOG_LEVELS, "log.level", f"must be one of {', '.join(LOG_LEVELS)}", self.level)
        _require(self.format in LOG_FORMATS, "log.format", "must be text or json", self.format)
        _require(self.access in ("on", "off"), "log.access", "must be on or off", self.access)


@dataclass(frozen=True)
class Config:
    """All daemon settings; ``config_file`` is the TOML file they were read from, if any."""

    server: ServerConfig = field(default_factory=ServerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    endpointing: EndpointingConfig = field(default_factory=EndpointingConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    log: LogConfig = field(default_factory=LogConfig)
    config_file: Path | None = None


_SECTIONS: dict[str, type[Any]] = {
    "server": ServerConfig, "engine": EngineConfig, "endpointing": EndpointingConfig, "gate": GateConfig,
    "admin": AdminConfig, "log": LogConfig,
}
_MISSING = object()


def _to_int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise ValueError(f"expected an integer, got {value!r}")


def _to_float(value: object) -> float:
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        number = float(value)
    except ValueError:
        raise ValueError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"expected a finite number, got {value!r}")
    return number


def _to_str(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _to_path(value: object) -> Path | None:
    text = _to_str(value)
    return Path(text).expanduser() if text else None


def _to_optional_int(value: object) -> int | None:
    return None if value == "" else _to_int(value)


def _to_list(value: object) -> tuple[str, ...]:
    """A TOML array of strings, or a comma-separated string (flags, environment)."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise ValueError(f"expected a list of strings, got {value!r}")


_METAVARS: dict[Callable[[object], Any], str] = {
    _to_int: "N", _to_optional_int: "N", _to_float: "NUMBER", _to_str: "TEXT", _to_path: "PATH",
    _to_list: "LIST",
}


@dataclass(frozen=True)
class Setting:
    """One setting: its TOML place, flag/env name, converter and help text."""

    section: str
    key: str
    convert: Callable[[object], Any]
    help: str
    default_text: str = ""
    choices: tuple[str, ...] = ()  # shown as the flag's value in `serve -h`; checked by the config

    @property
    def name(self) -> str:
        """Flag and environment name: the key, prefixed with the section for gate, admin and log."""
        return f"{self.section}_{self.key}" if self.section in ("gate", "admin", "log") else self.key

    @property
    def metavar(self) -> str:
        return "{" + ",".join(self.choices) + "}" if self.choices else _METAVARS[self.convert]

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def default(self) -> str:
        if self.default_text:
            return self.default_text
        value = {f.name: f.default for f in fields(_SECTIONS[self.section])}[self.key]
        return "unset" if value is None else str(value)


SETTINGS: tuple[Setting, ...] = (
    Setting("server", "host", _to_str, "address to listen on"),
    Setting("server", "port", _to_int, "websocket port (0 picks a free port)"),
    Setting("server", "max_streams", _to_int, "concurrent streams before refusing"),
    Setting("server", "max_message_bytes", _to_int, "largest websocket message"),
    Setting("server", "max_backlog_s", _to_float,
            "seconds of a stream's audio received but not yet decoded, at most"),
    Setting("server", "backlog_policy", _to_str,
            "at max_backlog_s: pace (stop reading until decoding catches up) or close (backlog_exceeded)",
            choices=BACKLOG_POLICIES),
    Setting("server", "idle_timeout_s", _to_float, "close a stream idle (no audio, no keepalive) this long"),
    Setting("server", "max_session_s", _to_float, "longest session"),
    Setting("server", "drain_timeout_s", _to_float, "on shutdown, how long open streams may finish"),
    Setting("server", "handshake_timeout_s", _to_float,
            "close a connection whose HTTP request and websocket handshake take longer"),
    Setting("server", "send_timeout_s", _to_float,
            "close a stream whose client has not taken its results for this long (slow_consumer)"),
    Setting("server", "tls_cert", _to_path, "TLS certificate chain (PEM); enables wss://"),
    Setting("server", "tls_key", _to_path, "TLS private key (PEM) if not in tls_cert"),
    Setting("server", "token_file", _to_path,
            "file holding the bearer token stream clients must present (unset: no token)"),
    Setting("server", "allowed_origins", _to_list,
            "browser origins allowed to open streams besides the server's own, comma-separated; * = any",
            "the server's own"),
    Setting("server", "allowed_hosts", _to_list,
            "host names a browser may reach the daemon by (DNS rebinding guard), comma-separated; *.example.com "
            "for subdomains, * = any", "localhost, IP addresses, this machine's name and server.host"),
    Setting("server", "workers", _to_int,
            "websocket front-end processes sharing the port (0: one event loop in the engine's process)"),
    Setting("server", "admission", _to_str,
            "capacity: admit min(max_streams, the real-time estimate) streams; max_streams: max_streams only",
            choices=ADMISSION_POLICIES),
    Setting("server", "admission_utilization", _to_float,
            "the share of one chunk's duration a decode step may take in the capacity estimate "
            "(results come about chunk x (1 + 2 x this) after their audio)"),
    Setting("server", "resume_grace_s", _to_float,
            "keep a stream whose connection dropped this long for its client to resume it (0 = never)"),
    Setting("server", "utterance_limit_s", _to_float,
            "cut every utterance at this length whatever a stream asks (its max_utterance_ms is capped to it)"),
    Setting("engine", "model", _to_path, "model file (.nemo or .pt)", "the shipped model"),
    Setting("engine", "device", _to_str, "auto, cpu, cuda or cuda:N"),
    Setting("engine", "dtype", _to_str, "fp32, bf16 or fp16", choices=("fp32", "bf16", "fp16")),
    Setting("engine", "right_context", _to_optional_int,
            "attention right context in 80 ms encoder frames (lookahead)", "the model's"),
    Setting("engine", "batch_wait_ms", _to_int, "how long a decode step waits for more streams"),
    Setting("engine", "gil_switch_ms", _to_float,
            "Python's thread switch interval: the longest the engine waits for the GIL per torch call"),
    Setting("engine", "thread_cpu", _to_optional_int,
            "a CPU for the engine thread alone while the model is on a GPU (the front ends and the daemon's "
            "other threads keep off it)", "none: every thread may use every CPU"),
    Setting("engine", "cuda_graphs", _to_str,
            "on: encoder and decoder steps replay CUDA graphs on a GPU; off: always eager", choices=("on", "off")),
    Setting("endpointing", "silence_after_speech_ms", _to_int,
            "end an utterance after this much silence following speech (0 = off)"),
    Setting("endpointing", "silence_without_speech_ms", _to_int,
            "discard an utterance with no speech after this much silence (0 = off)"),
    Setting("endpointing", "max_utterance_ms", _to_int, "cut an utterance at this length (0 = off)"),
    Setting("gate", "mode", _to_str,
            "on: words only where the audio may hold speech (silence, steady noise and tones give none); off",
            choices=("on", "off")),
    Setting("gate", "min_dbfs", _to_float,
            "audio quieter than this (dB below full scale, 250-3500 Hz) never counts as speech"),
    Setting("gate", "rise_db", _to_float,
            "speech rises at least this many dB above the quietest audio of the 1.5 s before it"),
    Setting("admin", "socket", _to_path, "admin unix socket ('' = off)",
            "$RUNTIME_DIRECTORY/admin.sock, $XDG_RUNTIME_DIR/streamd/admin.sock or "
            "/run/streamd/admin.sock"),
    Setting("admin", "host", _to_str, "admin TCP address"),
    Setting("admin", "port", _to_optional_int, "admin TCP port (needs a token file)", "off"),
    Setting("admin", "token_file", _to_path, "file holding the admin bearer token"),
    Setting("log", "level", _to_str, "debug, info, warning, error or critical", choices=LOG_LEVELS),
    Setting("log", "format", _to_str, "text or json", choices=LOG_FORMATS),
    Setting("log", "access", _to_str,
            "on: a line per stream as it ends (logger streamd.access, INFO: path, client address, why, seconds "
            "of audio); off: none, for daemons opening thousands of streams a second", choices=("on", "off")),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and one flag per setting; unset flags stay out of the namespace."""
    parser.add_argument(
        "--config", metavar="PATH", default=argparse.SUPPRESS,
        help=f"TOML config file ('' = none) [env {ENV_PREFIX}CONFIG; default: "
             f"{DEFAULT_CONFIG_PATH} if it exists]")
    groups = {name: parser.add_argument_group(f"{name} settings") for name in _SECTIONS}
    for s in SETTINGS:
        groups[s.section].add_argument(
            s.flag, dest=s.name, metavar=s.metavar, default=argparse.SUPPRESS,
            help=f"{s.help} [env {s.env}; default: {s.default()}]".replace("%", "%%"))


def load_config(args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None,
                *, default_path: Path = DEFAULT_CONFIG_PATH) -> Config:
    """Build the Config from parsed flags, environment variables and the TOML file.

    Raises:
        ConfigError: naming the bad setting and where its value came from.
    """
    env = os.environ if environ is None else environ
    flags = vars(args) if args is not None else {}
    path = _config_path(flags, env, default_path)
    table = _read_toml(path) if path else {}
    values: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    origins: dict[str, str] = {}
    for s in SETTINGS:
        raw, origin, in_file = _lookup(s, flags, env, table, path)
        if raw is _MISSING:
            continue
        try:
            value = s.convert(raw)
        except ValueError as err:
            raise ConfigError(f"{origin}: {err}") from None
        if isinstance(value, Path) and in_file and path is not None:
            value = path.parent / value  # relative paths in the file are relative to the file
        values[s.section][s.key] = value
        origins[f"{s.section}.{s.key}"] = origin
    values["admin"].setdefault("socket", default_admin_socket(env))
    try:
        sections = {name: cls(**values[name]) for name, cls in _SECTIONS.items()}
    except _InvalidSetting as err:
        source = origins.get(err.setting)
        raise ConfigError(f"{err} (from {source})" if source else str(err)) from None
    cfg = Config(**sections, config_file=path)
    _check_files(cfg, origins)
    return cfg


def _config_path(flags: Mapping[str, Any], env: Mapping[str, str], default: Path) -> Path | None:
    explicit = flags.get("config", env.get(ENV_PREFIX + "CONFIG"))
    if explicit is None:
        return default if default.is_file() else None
    return Path(explicit).expanduser() if explicit else None


def _lookup(s: Setting, flags: Mapping[str, Any], env: Mapping[str, str],
            table: Mapping[str, Mapping[str, object]], path: Path | None) -> tuple[object, str, bool]:
    """The highest-precedence raw value, a description of its origin, and whether it is from the file."""
    if s.name in flags:
        return flags[s.name], s.flag, False
    if s.env in env:
        return env[s.env], s.env, False
    section = table.get(s.section, {})
    if s.key in section:
        return section[s.key], f"{path} [{s.section}] {s.key}", True
    return _MISSING, "", False


def _read_toml(path: Path) -> dict[str, dict[str, object]]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: {err}") from None
    known = {name: {s.key for s in SETTINGS if s.section == name} for name in _SECTIONS}
    for name, section in data.items():
        if name not in known:
            raise ConfigError(f"{path}: unknown section [{name}]{_suggest(name, known)}")
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: [{name}] must be a table")
        for key in section:
            if key not in known[name]:
                raise ConfigError(f"{path}: unknown setting [{name}] {key}{_suggest(key, known[name])}")
    return data


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_files(cfg: Config, origins: Mapping[str, str]) -> None:
    for setting, path in (("engine.model", cfg.engine.model), ("server.tls_cert", cfg.server.tls_cert),
                          ("server.tls_key", cfg.server.tls_key), ("server.token_file", cfg.server.token_file),
                          ("admin.token_file", cfg.admin.token_file)):
        if path is not None and not path.exists():
            raise ConfigError(f"{setting}: no such file {path} (from {origins[setting]})")
