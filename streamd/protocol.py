"""The streaming websocket protocol, version 1, without I/O: the one module both sides import.

Everything on the wire is here: the paths, typed dataclasses for every message, parsing and
validation of client messages (the audio formats accepted included), serialisation of server
messages, the close codes, the error codes a client must not retry, and
:class:`SessionProtocol`, the per-connection state machine that checks message order and numbers
outgoing messages. The server (``streamd.server``) and the clients (``streamd.clients``) import
it; it imports no torch. ``docs/protocol.md`` is the user-facing description.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar, Literal, TypeVar, Union, cast, get_args

# The close codes: 1000 after ``summary`` (``stop``), 1001 at shutdown, an error's ``close_code`` else.
from websockets.frames import CloseCode as CloseCode

from streamd.config import MAX_ENDPOINT_MS, EndpointingConfig
from streamd.errors import ProtocolViolation, StreamdError, UnsupportedAudio, echo


PROTOCOL_VERSION = "1"
STREAM_PATH = "/v1/stream"
REALTIME_PATH = "/v1/realtime"  # the OpenAI Realtime face (``streamd.server.realtime``)
LISTEN_PATH = "/v1/listen"  # the Deepgram live face (``streamd.server.deepgram``)
_MAX_CLOSE_REASON_BYTES = 123

# Audio formats ``start`` may declare; the server resamples and mixes to what the model takes.
MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 48_000
MAX_CHANNELS = 8
Encoding = Literal["s16le", "f32le"]
ENCODINGS: tuple[Encoding, ...] = get_args(Encoding)

# Handshakes refused with these HTTP statuses (no websocket, no error message), as the error
# code clients report and an explanation for the user.
HANDSHAKE_REFUSALS: Mapping[int, tuple[str, str]] = {
    HTTPStatus.UNAUTHORIZED: ("unauthorized", "the daemon needs a bearer token (--token-file)"),
    HTTPStatus.FORBIDDEN: ("forbidden", "the daemon does not take streams from this origin")}
# Error codes that a new connection would only repeat: the client must change, not retry.
FATAL_ERRORS = frozenset({ProtocolViolation.code, UnsupportedAudio.code,
                          *(code for code, _ in HANDSHAKE_REFUSALS.values())})
# `streamd admin drain --handoff`: the stream was ended so that it continues on another daemon.
HANDOFF_CLOSE = 1012
# The session was resumed on another connection (by a client with its resume secret): do not resume it again.
TAKEN_OVER_CLOSE = 4409
MAX_SESSION_ID = 64
MAX_RESUME_SECRET = 128

FinalReason = Literal["endpoint", "max_utterance", "finalize", "end_of_stream"]


def check_format(sample_rate: int, encoding: str, channels: int) -> None:
    """Raise UnsupportedAudio unless the stream format is one streamd accepts."""
    if encoding not in ENCODINGS:
        raise UnsupportedAudio(f"unsupported encoding {echo(encoding)}; use one of {', '.join(ENCODINGS)}")
    if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise UnsupportedAudio(
            f"unsupported sample_rate {echo(sample_rate)}; use {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz")
    if not 1 <= channels <= MAX_CHANNELS:
        raise UnsupportedAudio(f"unsupported channels {echo(channels)}; use 1..{MAX_CHANNELS}")


# -- client -> server ---------------------------------------------------------------------------

@dataclass(frozen=True)
class EndpointingOptions:
    """Per-stream endpoint overrides from ``start``; None keeps the server's value."""

    silence_after_speech_ms: int | None = None
    silence_without_speech_ms: int | None = None
    max_utterance_ms: int | None = None
    disabled: bool = False

    def resolve(self, defaults: EndpointingConfig) -> EndpointingConfig:
        """The rules for this stream: the server defaults with these overrides applied."""
        if self.disabled:
            return EndpointingConfig(0, 0, 0)
        changes = {f.name: getattr(self, f.name) for f in dataclasses.fields(EndpointingConfig)}
        return dataclasses.replace(defaults, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True)
class Resume:
    """``start``'s ``resume``: continue session ``session_id`` after the last message seen;
    ``secret`` is the ``resume_secret`` of the session's ``ready`` (without it nothing resumes)."""

    session_id: str
    last_seq: int
    secret: str = ""


@dataclass(frozen=True)
class Start:
    """First client message: the audio format and the stream options."""

    type: ClassVar[str] = "start"
    sample_rate: int
    encoding: Encoding
    channels: int = 1
    interim_results: bool = True
    word_times: bool = False
    endpointing: EndpointingOptions = EndpointingOptions()
    resume: Resume | None = None


@dataclass(frozen=True)
class Finalize:
    """End the current utterance now and keep streaming."""

    type: ClassVar[str] = "finalize"


@dataclass(frozen=True)
class Stop:
    """End of audio: flush, send finals and the summary, close with 1000."""

    type: ClassVar[str] = "stop"


@dataclass(frozen=True)
class KeepAlive:
    """Reset the idle timer without sending audio."""

    type: ClassVar[str] = "keepalive"


ClientMessage = Union[Start, Finalize, Stop, KeepAlive]


# -- server -> client ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Word:
    """One word of a final result with its stream times in seconds."""

    word: str
    start: float
    end: float


@dataclass(frozen=True)
class Ready:
    """First server message: the session and how it will be served."""

    type: ClassVar[str] = "ready"
    session_id: str
    model: str
    device: str
    dtype: str
    chunk_ms: int
    sample_rate: int
    endpointing: EndpointingConfig
    idle_timeout_s: float
    max_session_s: float
    protocol: str = PROTOCOL_VERSION
    resume_secret: str | None = None  # what a resume needs besides the session id (None: no resume)


@dataclass(frozen=True)
class Resumed:
    """First message on a connection that resumed a session. Its ``seq`` is the client's
    ``last_seq``; the results after it follow, then new ones. The client resends its audio
    from byte ``audio_bytes`` and its ``finalize`` messages after the first ``finalizes``."""

    type: ClassVar[str] = "resumed"
    session_id: str
    audio_bytes: int
    finalizes: int


@dataclass(frozen=True)
class Partial:
    """Interim hypothesis of the current utterance; a later message may revise it."""

    type: ClassVar[str] = "partial"
    utterance: int
    text: str
    start: float
    end: float
    audio_processed: float


@dataclass(frozen=True)
class Final:
    """The settled text of an utterance; words/tokens only when requested."""

    type: ClassVar[str] = "final"
    utterance: int
    text: str
    start: float
    end: float
    audio_processed: float
    reason: FinalReason
    words: tuple[Word, ...] | None = None
    tokens: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Error:
    """A fatal error; the server closes the connection right after it."""

    type: ClassVar[str] = "error"
    code: str
    message: str

    @classmethod
    def from_exception(cls, exc: StreamdError) -> Error:
        return cls(code=exc.code, message=exc.message)


@dataclass(frozen=True)
class Summary:
    """Last message of a session that ended cleanly."""

    type: ClassVar[str] = "summary"
    utterances: int
    partials: int
    audio_seconds: float
    session_seconds: float
    reason: Literal["stop", "shutdown"]


ServerMessage = Union[Ready, Resumed, Partial, Final, Error, Summary]


# -- parsing client messages --------------------------------------------------------------------

_T = TypeVar("_T")


_KIND_NAMES: dict[type, str] = {int: "an integer", str: "a string", bool: "true or false"}
_ENDPOINT_KEYS = tuple(f.name for f in dataclasses.fields(EndpointingConfig))
_START_KEYS = ("sample_rate", "encoding", "channels", "interim_results", "word_times", "endpointing", "resume")


def _field(data: Mapping[str, Any], key: str, kind: type[_T], default: _T | None = None) -> _T:
    if key not in data:
        if default is None:
            raise ProtocolViolation(f'"start" needs "{key}"')
        return default
    value = data[key]
    # bool is an int subclass: reject true/false where a number is expected.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolViolation(f'"{key}" must be {_KIND_NAMES[kind]}, got {echo(value)}')
    return value


def _check_keys(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(data) - set(allowed) - {"type"})
    if unknown:
        raise ProtocolViolation(f"unknown field {echo(unknown[0])} in {where}; allowed: {', '.join(allowed)}")


def _parse_endpointing(value: Any) -> EndpointingOptions:
    if value is True:
        return EndpointingOptions()
    if value is False:
        return EndpointingOptions(disabled=True)
    if not isinstance(value, dict):
        raise ProtocolViolation('"endpointing" must be an object, true or false')
    _check_keys(value, _ENDPOINT_KEYS, '"endpointing"')
    overrides: dict[str, Any] = {}
    for key in value:
        ms = _field(value, key, int)
        if not 0 <= ms <= MAX_ENDPOINT_MS:
            raise ProtocolViolation(f'"{key}" must be in 0..{MAX_ENDPOINT_MS} ms, got {echo(ms)}')
        overrides[key] = ms
    return EndpointingOptions(**overrides)


def _parse_resume(value: Any) -> Resume | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolViolation('"resume" must be an object like {"session_id": "...", "last_seq": 7}')
    _check_keys(value, ("session_id", "secret", "last_seq"), '"resume"')
    session_id = _field(value, "session_id", str)
    last_seq = _field(value, "last_seq", int)
    secret = _field(value, "secret", str, "")
    if not 0 < len(session_id) <= MAX_SESSION_ID or last_seq < 0 or len(secret) > MAX_RESUME_SECRET:
        raise ProtocolViolation(f'"resume" needs a session_id of 1..{MAX_SESSION_ID} characters, a secret of at most '
                                f'{MAX_RESUME_SECRET} and a last_seq >= 0')
    return Resume(session_id, last_seq, secret)


def _parse_start(data: Mapping[str, Any]) -> Start:
    _check_keys(data, _START_KEYS, '"start"')
    sample_rate = _field(data, "sample_rate", int)
    encoding = _field(data, "encoding", str)
    channels = _field(data, "channels", int, 1)
    check_format(sample_rate, encoding, channels)
    return Start(
        sample_rate=sample_rate,
        encoding=cast(Encoding, encoding),  # checked by check_format
        channels=channels,
        interim_results=_field(data, "interim_results", bool, True),
        word_times=_field(data, "word_times", bool, False),
        endpointing=_parse_endpointing(data.get("endpointing", True)),
        resume=_parse_resume(data.get("resume")),
    )


def _control(cls: Callable[[], _T], name: str) -> Callable[[Mapping[str, Any]], _T]:
    def parse(data: Mapping[str, Any]) -> _T:
        _check_keys(data, (), f'"{name}"')
        return cls()
    return parse


_CLIENT_PARSERS: dict[str, Callable[[Mapping[str, Any]], ClientMessage]] = {
    "start": _parse_start,
    "finalize": _control(Finalize, "finalize"),
    "stop": _control(Stop, "stop"),
    "keepalive": _control(KeepAlive, "keepalive"),
}


def parse_client_message(text: str) -> ClientMessage:
    """Parse one client text message.

    Raises:
        ProtocolViolation: malformed JSON, not an object, unknown type, bad or unknown field.
        UnsupportedAudio: ``start`` names a rate, encoding or channel count streamd rejects.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProtocolViolation(f"message is not valid JSON: {err.msg} at position {err.pos}") from None
    except RecursionError:
        raise ProtocolViolation("message is not acceptable JSON: nested too deeply") from None
    except ValueError:  # an integer literal longer than Python converts (4300 digits)
        raise ProtocolViolation("message is not acceptable JSON: a number is too long") from None
    if not isinstance(data, dict):
        raise ProtocolViolation("message must be a JSON object")
    kind = data.get("type")
    parser = _CLIENT_PARSERS.get(kind) if isinstance(kind, str) else None
    if parser is None:
        raise ProtocolViolation(
            f"unknown message type {echo(kind)}; expected one of {', '.join(_CLIENT_PARSERS)}")
    return parser(data)


def encode_client_message(message: ClientMessage) -> str:
    """Serialise a client message (for clients); default endpointing is left out."""
    body: dict[str, Any] = {"type": message.type}
    if isinstance(message, Start):
        body.update(sample_rate=message.sample_rate, encoding=message.encoding, channels=message.channels,
                    interim_results=message.interim_results, word_times=message.word_times)
        options = message.endpointing
        if options.disabled:
            body["endpointing"] = False
        elif options != EndpointingOptions():
            body["endpointing"] = {k: getattr(options, k) for k in _ENDPOINT_KEYS
                                   if getattr(options, k) is not None}
        if message.resume is not None:
            body["resume"] = {"session_id": message.resume.session_id, "secret": message.resume.secret,
                              "last_seq": message.resume.last_seq}
    return json.dumps(body, separators=(",", ":"))


# -- serialising server messages ----------------------------------------------------------------

@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _plain(value: Any) -> Any:
    """`value` as JSON types: dataclasses and mappings as objects without their None fields,
    sequences as arrays, floats rounded to milliseconds (a result's times)."""
    if isinstance(value, float):
        return round(value, 3)
    if value is None or isinstance(value, (str, int)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: _plain(v) for name in _field_names(type(value)) if (v := getattr(value, name)) is not None}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def encode_message(message: ServerMessage, seq: int) -> str:
    """Serialise a server message as compact JSON; times are rounded to milliseconds."""
    return json.dumps({"type": message.type, "seq": seq, **_plain(message)}, ensure_ascii=False,
                      separators=(",", ":"))


_SERVER_TYPES: dict[str, type[Any]] = {cls.type: cls for cls in (Ready, Resumed, Partial, Final, Error, Summary)}


def parse_server_message(text: str) -> ServerMessage:
    """Parse a server message (for clients); unknown fields are ignored.

    Raises:
        ProtocolViolation: not a server message of this protocol version.
    """
    try:
        data = json.loads(text)
        cls = _SERVER_TYPES[data["type"]]
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        if cls is Ready:
            kwargs["endpointing"] = EndpointingConfig(**kwargs["endpointing"])
        if cls is Final:
            if "words" in kwargs:
                kwargs["words"] = tuple(Word(**w) for w in kwargs["words"])
            if "tokens" in kwargs:
                kwargs["tokens"] = tuple(kwargs["tokens"])
        message: ServerMessage = cls(**kwargs)
    except (ValueError, KeyError, TypeError) as err:
        raise ProtocolViolation(f"not a protocol {PROTOCOL_VERSION} server message: {err}") from None
    return message


def close_for(exc: StreamdError) -> tuple[int, str]:
    """The websocket close code and reason (at most 123 UTF-8 bytes) for an error."""
    reason = exc.message.encode()[:_MAX_CLOSE_REASON_BYTES].decode(errors="ignore")
    return (exc.close_code if exc.close_code is not None else CloseCode.INTERNAL_ERROR), reason



# -- per-session state machine ------------------------------------------------------------------

class Phase(enum.Enum):
    """Where a session is: waiting for start, streaming, stopped by the client, or closed."""

    AWAITING_START = "awaiting_start"
    STREAMING = "streaming"
    STOPPED = "stopped"
    CLOSED = "closed"


class SessionProtocol:
    """Checks the order of client messages and numbers server messages (``seq``).

    Client order: ``start``, then audio and ``finalize``/``keepalive`` in any
    order, then optionally ``stop``. Server order: ``ready`` (or an ``error``)
    first; nothing after ``summary`` or ``error``.
    """

    def __init__(self) -> None:
        self.phase = Phase.AWAITING_START
        self.start: Start | None = None
        self._seq = 0

    @property
    def seq(self) -> int:
        """The ``seq`` the next outgoing message will carry."""
        return self._seq

    def receive_text(self, text: str) -> ClientMessage:
        """Parse a client text message and check it is allowed now."""
        message = parse_client_message(text)
        if self.phase is Phase.AWAITING_START and not isinstance(message, Start):
            raise ProtocolViolation(f'the first message must be "start", got "{message.type}"')
        if self.phase is Phase.STREAMING and isinstance(message, Start):
            raise ProtocolViolation('"start" was already sent')
        if self.phase in (Phase.STOPPED, Phase.CLOSED):
            raise ProtocolViolation(f'"{message.type}" after the stream ended')
        if isinstance(message, Start):
            self.start = message
            self.phase = Phase.STREAMING
        elif isinstance(message, Stop):
            self.phase = Phase.STOPPED
        return message

    def receive_audio(self) -> None:
        """Check that a binary (audio) message is allowed now."""
        if self.phase is Phase.AWAITING_START:
            raise ProtocolViolation('audio before "start"')
        if self.phase is not Phase.STREAMING:
            raise ProtocolViolation('audio after "stop"')

    def encode(self, message: ServerMessage) -> str:
        """Serialise the next server message with its ``seq``.

        Raises:
            RuntimeError: the server sent out of order (a bug, not a client fault).
        """
        if self.phase is Phase.CLOSED:
            raise RuntimeError(f"cannot send {message.type!r}: the session is closed")
        if self._seq == 0 and not isinstance(message, (Ready, Error)):
            raise RuntimeError(f"cannot send {message.type!r} before 'ready'")
        text = encode_message(message, self._seq)
        self._seq += 1
        if isinstance(message, (Summary, Error)):
            self.phase = Phase.CLOSED
        return text
