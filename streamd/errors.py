"""The streamd exception tree.

Every error a client can see has a stable ``code`` (sent in the protocol's
``error`` message) and, where the error ends a websocket session, the
``close_code`` the server closes with (``streamd.protocol.close_for`` maps exceptions to close
frames); this module holds no handling logic (only `echo`, which quotes client values). It
imports only the standard library (``streamd.config`` uses it and must not import websockets).
"""
from __future__ import annotations

import json
from typing import Any, ClassVar

MAX_ECHO_CHARS = 64


def echo(value: Any) -> str:
    """A client-supplied value as JSON for an error message, cut to `MAX_ECHO_CHARS` characters,
    so that no client can make the daemon log (or send back) megabytes."""
    try:  # lone surrogates (JSON allows "\ud800") are escaped: the text must encode as UTF-8
        text = json.dumps(value, ensure_ascii=False).encode("utf-8", "backslashreplace").decode()
    except (TypeError, ValueError, RecursionError):
        text = "<unprintable>"
    if len(text) > MAX_ECHO_CHARS:
        return f"{text[:MAX_ECHO_CHARS]}... ({len(text)} characters)"
    return text


class StreamdError(Exception):
    """Base class of every error streamd raises on purpose.

    Attributes:
        code: machine-readable identifier, e.g. ``"protocol_violation"``.
        close_code: websocket close code for errors that end a session, else None.
    """

    code: ClassVar[str] = "error"
    close_code: ClassVar[int | None] = None

    @property
    def message(self) -> str:
        """The human-readable message (the first constructor argument)."""
        return str(self.args[0]) if self.args else self.code


class ConfigError(StreamdError):
    """Invalid settings from flags, environment or the TOML file."""

    code = "config_error"


class ProtocolViolation(StreamdError):
    """The client broke the protocol: bad JSON, unknown type, bad field, wrong order."""

    code = "protocol_violation"
    close_code = 1008


class UnsupportedAudio(StreamdError):
    """Audio the server cannot accept: encoding, rate, channels, NaN/inf samples."""

    code = "unsupported_audio"
    close_code = 1003


class IdleTimeout(StreamdError):
    """No audio and no keepalive for ``idle_timeout_s``."""

    code = "idle_timeout"
    close_code = 1008


class SessionExpired(StreamdError):
    """The session ran longer than ``max_session_s``."""

    code = "session_expired"
    close_code = 1008


class BacklogExceeded(StreamdError):
    """The client sent more than ``max_backlog_s`` of audio ahead of decoding (policy ``close``)."""

    code = "backlog_exceeded"
    close_code = 1008


class SlowConsumer(StreamdError):
    """The client has not taken its results for ``send_timeout_s``."""

    code = "slow_consumer"
    close_code = 1008


class Overloaded(StreamdError):
    """No capacity for another stream; retry later."""

    code = "overloaded"
    close_code = 1013


class InternalError(StreamdError):
    """An unexpected server fault (a bug or a device failure)."""

    code = "internal_error"
    close_code = 1011


# The engine's own errors: serving turns them into the errors above (or an admin report).

class CapacityError(RuntimeError):
    """Every engine slot is taken (a stream's open is refused; serving answers `Overloaded`)."""


class StreamFailed(RuntimeError):
    """The engine could not process this stream's audio (the step raised)."""


class MigrationFailed(RuntimeError):
    """The move did not happen; the engine still serves from the source placement."""


class EngineDied(RuntimeError):
    """The engine thread stopped on an error (a bug): nothing is served any more, so the daemon
    exits (non-zero: systemd's `Restart=on-failure` starts it again)."""
