"""The OpenAI Realtime transcription protocol on ``/v1/realtime``, served by the native stream.

A realtime session is a native stream (:class:`streamd.server.handler.Connection`) with other
events: the same engine segments, endpointing, limits and timeouts. ``session.update`` (or the
beta ``transcription_session.update``) becomes the native ``start``; ``input_audio_buffer.append``
is a binary audio message; ``commit`` is ``finalize``; ``clear`` ends the segment and drops its
results. Results map to events: the first partial of an utterance is ``speech_started`` (server
VAD), partials are ``delta`` events of the text they append, an endpoint final is
``speech_stopped`` + ``committed`` + ``completed``. Errors in client events are answered with an
``error`` event and the session goes on. ``docs/protocol.md`` has the user-facing description.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import numpy as np
import numpy.typing as npt
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from streamd.config import MAX_ENDPOINT_MS
from streamd.errors import MAX_ECHO_CHARS, SessionExpired, SlowConsumer, StreamdError, echo
from streamd import protocol as p
from streamd.server.context import StreamContext
from streamd.server.handler import Connection
from streamd.session.core import Result

log = logging.getLogger("streamd.server")

SPEC_RATE = 24_000  # the spec's only PCM rate; streamd takes any rate the native protocol takes
G711_RATE = 8_000
MAX_EVENT_ID = 512  # a client's event_id is echoed in errors: no longer than this
AudioFormat = Literal["pcm16", "g711_ulaw", "g711_alaw"]
_BETA_FORMATS: dict[str, AudioFormat] = {"pcm16": "pcm16", "g711_ulaw": "g711_ulaw", "g711_alaw": "g711_alaw"}
_GA_FORMATS: dict[str, AudioFormat] = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
_GA_NAMES = {v: k for k, v in _GA_FORMATS.items()}
# Client events of the spec that a transcription-only server does not implement.
UNSUPPORTED_EVENTS = ("conversation.item.create", "conversation.item.retrieve", "conversation.item.truncate",
                      "conversation.item.delete", "response.create", "response.cancel", "output_audio_buffer.clear")
_EVENTS = ("session.update", "transcription_session.update", "input_audio_buffer.append",
           "input_audio_buffer.commit", "input_audio_buffer.clear")
_SERVER_VAD_KEYS = ("type", "silence_duration_ms", "threshold", "prefix_padding_ms", "create_response",
                    "interrupt_response", "idle_timeout_ms")
_TRANSCRIPTION_KEYS = ("model", "language", "prompt", "languages", "keywords", "delay")


def _g711_tables() -> dict[AudioFormat, npt.NDArray[np.int16]]:
    """ITU-T G.711 decoding: each of the 256 codes as a 16-bit sample."""
    u = ~np.arange(256) & 0xFF
    exp, mant = (u >> 4) & 7, u & 0x0F
    mag = (((mant << 3) + 0x84) << exp) - 0x84
    ulaw = np.where(u & 0x80, -mag, mag)
    a = np.arange(256) ^ 0x55
    exp, mant = (a >> 4) & 7, a & 0x0F
    mag = np.where(exp == 0, (mant << 4) + 8, ((mant << 4) + 0x108) << np.maximum(exp - 1, 0))
    alaw = np.where(a & 0x80, mag, -mag)
    return {"g711_ulaw": ulaw.astype("<i2"), "g711_alaw": alaw.astype("<i2")}


G711 = _g711_tables()


class RealtimeError(Exception):
    """A client event streamd rejects: answered with an ``error`` event; the session goes on."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


@dataclass(frozen=True)
class SessionConfig:
    """What streamd honours of a realtime session's settings."""

    format: AudioFormat = "pcm16"
    rate: int = SPEC_RATE
    vad: bool = True  # server VAD (our endpointing); False: turn_detection null, commits only
    silence_ms: int | None = None  # turn_detection.silence_duration_ms; None: the server's rule

    def start(self) -> p.Start:
        """The native ``start`` this session is served as."""
        endpointing = (p.EndpointingOptions(silence_after_speech_ms=self.silence_ms) if self.vad
                       else p.EndpointingOptions(disabled=True))
        return p.Start(sample_rate=self.rate, encoding="s16le", endpointing=endpointing)


# -- parsing client events ----------------------------------------------------------------------

def _check_keys(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in allowed:
            param = (f"{where}.{key}" if where else key)[:2 * MAX_ECHO_CHARS]
            raise RealtimeError("unknown_parameter", f"unknown parameter {echo(param)}; streamd knows "
                                f"{', '.join(allowed)}", param)


def _object(value: Any, param: str, nullable: bool = False) -> dict[str, Any] | None:
    if value is None and nullable:
        return None
    if not isinstance(value, dict):
        raise RealtimeError("invalid_type", f"{param} must be an object{' or null' if nullable else ''}, "
                            f"got {echo(value)}", param)
    return value


def _int(value: Any, param: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise RealtimeError("invalid_type", f"{param} must be an integer, got {echo(value)}", param)
    if not low <= value <= high:
        raise RealtimeError("invalid_value", f"{param} must be in {low}..{high}, got {echo(value)}", param)
    return value


def _ignored(value: Any, param: str, keys: tuple[str, ...]) -> None:
    """Check a setting streamd accepts and ignores (an object or null)."""
    if (obj := _object(value, param, nullable=True)) is not None:
        _check_keys(obj, keys, param)


def _include(value: Any, param: str) -> None:
    if value is None or value == []:
        return
    raise RealtimeError("unsupported", f"{param}: streamd sends no logprobs or other extra outputs", param)


def _turn_detection(config: SessionConfig, value: Any, param: str) -> SessionConfig:
    turn = _object(value, param, nullable=True)
    if turn is None:
        return replace(config, vad=False, silence_ms=None)
    vad = turn.get("type")
    if vad == "semantic_vad":
        raise RealtimeError("unsupported", "semantic_vad is not supported; use server_vad (streamd's "
                            "endpointing) or null (commit turns yourself)", f"{param}.type")
    if vad != "server_vad":
        raise RealtimeError("invalid_value", f"{param}.type must be \"server_vad\", got {echo(vad)}",
                            f"{param}.type")
    _check_keys(turn, _SERVER_VAD_KEYS, param)
    silence = turn.get("silence_duration_ms")
    if silence is not None:
        silence = _int(silence, f"{param}.silence_duration_ms", 1, MAX_ENDPOINT_MS)
    return replace(config, vad=True, silence_ms=silence)


def update_ga(config: SessionConfig, session: Mapping[str, Any]) -> SessionConfig:
    """Apply a ``session.update``'s session (the GA shape); only the fields present change."""
    _check_keys(session, ("type", "audio", "include"), "session")
    session_type = session.get("type", "transcription")
    if session_type == "realtime":
        raise RealtimeError("unsupported", "conversation sessions are not supported: streamd only transcribes; "
                            "use \"type\": \"transcription\"", "session.type")
    if session_type != "transcription":
        raise RealtimeError("invalid_value", f"session.type must be \"transcription\", got {echo(session_type)}",
                            "session.type")
    _include(session.get("include"), "session.include")
    audio = _object(session.get("audio", {}), "session.audio") or {}
    _check_keys(audio, ("input",), "session.audio")
    where = "session.audio.input"
    audio_in = _object(audio.get("input", {}), where) or {}
    _check_keys(audio_in, ("format", "noise_reduction", "transcription", "turn_detection"), where)
    _ignored(audio_in.get("noise_reduction"), f"{where}.noise_reduction", ("type", "strength"))
    _ignored(audio_in.get("transcription"), f"{where}.transcription", _TRANSCRIPTION_KEYS)
    if "format" in audio_in:
        fmt = _object(audio_in["format"], f"{where}.format") or {}
        _check_keys(fmt, ("type", "rate"), f"{where}.format")
        format_type = fmt.get("type", "audio/pcm")
        name = _GA_FORMATS.get(format_type) if isinstance(format_type, str) else None
        if name is None:
            raise RealtimeError("invalid_value", f"{where}.format.type must be one of {', '.join(_GA_FORMATS)}, "
                                f"got {echo(fmt.get('type'))}", f"{where}.format.type")
        if name == "pcm16":
            rate = _int(fmt.get("rate", SPEC_RATE), f"{where}.format.rate", p.MIN_SAMPLE_RATE,
                        p.MAX_SAMPLE_RATE)
        else:
            rate = _int(fmt.get("rate", G711_RATE), f"{where}.format.rate", G711_RATE, G711_RATE)
        config = replace(config, format=name, rate=rate)
    if "turn_detection" in audio_in:
        config = _turn_detection(config, audio_in["turn_detection"], f"{where}.turn_detection")
    return config


def update_beta(config: SessionConfig, session: Mapping[str, Any]) -> SessionConfig:
    """Apply a ``transcription_session.update``'s session (the beta shape)."""
    _check_keys(session, ("input_audio_format", "input_audio_transcription", "turn_detection",
                          "input_audio_noise_reduction", "include", "modalities"), "session")
    _include(session.get("include"), "session.include")
    _ignored(session.get("input_audio_noise_reduction"), "session.input_audio_noise_reduction", ("type",))
    _ignored(session.get("input_audio_transcription"), "session.input_audio_transcription", _TRANSCRIPTION_KEYS)
    if "input_audio_format" in session:
        value = session["input_audio_format"]
        name = _BETA_FORMATS.get(value) if isinstance(value, str) else None
        if name is None:
            raise RealtimeError("invalid_value", "session.input_audio_format must be one of "
                                f"{', '.join(_BETA_FORMATS)}, got {echo(session['input_audio_format'])}",
                                "session.input_audio_format")
        config = replace(config, format=name, rate=SPEC_RATE if name == "pcm16" else G711_RATE)
    if "turn_detection" in session:
        config = _turn_detection(config, session["turn_detection"], "session.turn_detection")
    return config


def _parse(data: str | bytes) -> dict[str, Any]:
    if isinstance(data, bytes):
        raise RealtimeError("invalid_event", "binary messages are not part of the Realtime protocol; send audio "
                            "as base64 in input_audio_buffer.append events")
    try:
        event = json.loads(data)
    except json.JSONDecodeError as err:
        raise RealtimeError("invalid_event", f"message is not valid JSON: {err.msg} at position {err.pos}") from None
    except RecursionError:
        raise RealtimeError("invalid_event", "message is not acceptable JSON: nested too deeply") from None
    except ValueError:  # an integer literal longer than Python converts (4300 digits)
        raise RealtimeError("invalid_event", "message is not acceptable JSON: a number is too long") from None
    if not isinstance(event, dict):
        raise RealtimeError("invalid_event", "message must be a JSON object")
    event_id = event.get("event_id", "")
    if not isinstance(event_id, str):
        raise RealtimeError("invalid_type", "event_id must be a string", "event_id")
    if len(event_id) > MAX_EVENT_ID:
        raise RealtimeError("invalid_value", f"event_id must be at most {MAX_EVENT_ID} characters, got "
                            f"{len(event_id)}", "event_id")
    return event


def _audio(event: Mapping[str, Any]) -> bytes:
    _check_keys(event, ("type", "event_id", "audio"), "")
    if "audio" not in event:
        raise RealtimeError("missing_required_parameter", "input_audio_buffer.append needs \"audio\"", "audio")
    if not isinstance(event["audio"], str):
        raise RealtimeError("invalid_type", "audio must be a base64 string", "audio")
    try:
        return base64.b64decode(event["audio"], validate=True)
    except ValueError as err:
        raise RealtimeError("invalid_base64", f"audio is not valid base64: {err}", "audio") from None


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


# -- the connection -----------------------------------------------------------------------------

class RealtimeConnection(Connection):
    """One ``/v1/realtime`` websocket: Realtime transcription events over the native stream machinery.

    The engine stream starts at the first ``append``; the session settings are fixed from then on.
    """

    def __init__(self, ws: ServerConnection, state: StreamContext) -> None:
        super().__init__(ws, state)
        assert ws.request is not None
        self.beta = "realtime=v1" in ws.request.headers.get("OpenAI-Beta", "")
        self.intent = parse_qs(urlsplit(ws.request.path).query).get("intent", ["transcription"])[-1]
        self.config = SessionConfig()
        self.sender: asyncio.Task[None] | None = None
        self.appended = False  # audio since the last commit or clear
        self.events = 0
        self.previous_item: str | None = None
        self.spoken = -1  # the last utterance whose speech_started was sent
        self.deltas: tuple[int, str] = (-1, "")  # an utterance and the text sent for it as deltas

    async def _serve(self) -> str:
        cfg = self.state.config.server
        await self._event("transcription_session.created" if self.beta else "session.created",
                          session=self._describe(self.beta))
        if self.intent != "transcription":
            await self._error(RealtimeError("unsupported", f"intent={echo(self.intent)} is not supported: streamd "
                                            "only transcribes (intent=transcription)", "intent"))
            await self._close(p.CloseCode.POLICY_VIOLATION, "only intent=transcription is supported")
            return "unsupported intent"
        try:
            while (data := await self._recv(cfg.idle_timeout_s, allow_shutdown=True)) is not None:
                if time.monotonic() - self.started > cfg.max_session_s:
                    raise SessionExpired(f"session longer than max_session_s={cfg.max_session_s:g}")
                if self.sender is not None and self.sender.done():
                    self.sender.result()  # raises what ended it
                audio = await self._handle(data)
                del data  # the event is let go of before its audio is fed (and paced)
                if audio:
                    await self._append(audio)
                del audio
            await self._drain()
        finally:
            if self.sender is not None:
                self.sender.cancel()
            for segment_stream in self.engine_streams.values():
                self.state.engine.close(segment_stream.engine)
        await self._close(p.CloseCode.GOING_AWAY)
        return "shutdown"

    async def _handle(self, data: str | bytes) -> bytes | None:
        """Take one client event; an `append`'s audio is returned (decoded), for the caller to
        feed once it has let go of the event."""
        event_id: str | None = None
        try:
            event = _parse(data)
            event_id = event.get("event_id")
            return await self._dispatch(event)
        except RealtimeError as e:
            await self._error(e, event_id)
            return None

    async def _dispatch(self, event: dict[str, Any]) -> bytes | None:
        event_type = event.get("type")
        if event_type == "input_audio_buffer.append":
            return _audio(event)
        if event_type in ("input_audio_buffer.commit", "input_audio_buffer.clear"):
            _check_keys(event, ("type", "event_id"), "")
        if event_type == "input_audio_buffer.commit":
            if not self.appended:
                raise RealtimeError("input_audio_buffer_commit_empty",
                                    "no audio was appended since the last commit or clear")
            await self._next_segment("finalize")
        elif event_type == "input_audio_buffer.clear":
            if self.appended:
                await self._next_segment("clear")
            await self._event("input_audio_buffer.cleared")
        elif event_type in ("session.update", "transcription_session.update"):
            beta = event_type == "transcription_session.update"
            _check_keys(event, ("type", "event_id", "session"), "")
            if "session" not in event:
                raise RealtimeError("missing_required_parameter", f"{event_type} needs \"session\"", "session")
            session = _object(event["session"], "session") or {}
            config = (update_beta if beta else update_ga)(self.config, session)
            if self.session.start is not None and config != self.config:
                raise RealtimeError("session_update_after_audio", "the audio format and turn detection cannot "
                                    "change once audio was appended; open a new session", "session")
            self.config = config
            await self._event(f"{event_type}d", session=self._describe(beta))
        elif event_type in UNSUPPORTED_EVENTS:
            raise RealtimeError("unsupported", f"{event_type} is not supported: streamd only transcribes (no "
                                "conversation items, no responses)", "type")
        else:
            raise RealtimeError("unknown_event", f"unknown event type {echo(event_type)}; streamd takes "
                                f"{', '.join(_EVENTS)}", "type")
        return None

    async def _append(self, audio: bytes) -> None:
        if not audio:
            return
        if self.session.start is None:
            self.session.begin(self.config.start())
            await self._run_commands()  # open the first segment
            self.sender = asyncio.create_task(self._sender())
            self.sender.add_done_callback(self._sender_done)
        assert self.sender is not None
        table = G711[self.config.format] if self.config.format != "pcm16" else None
        self.appended = True
        # on shutdown, the next receive ends the loop
        await self._feed(audio, self.sender, None if table is None else lambda b: table[np.frombuffer(b, np.uint8)].tobytes())

    async def _next_segment(self, reason: Literal["finalize", "clear"]) -> None:
        """End the open segment (`finalize`: transcribe it; `clear`: drop its results) and open the next."""
        self.session.finalize(reason)
        await self._run_commands()
        self.appended = False

    async def _drain(self) -> None:
        """Shutting down: transcribe the audio not yet committed, then let the sender finish."""
        if self.session.segment is None or self.sender is None:
            return
        self.session.end()
        await self._run_commands()
        await self.sender

    async def _deliver(self, result: Result) -> None:
        """Map a native result to realtime events (see the module doc); the session drops the
        results of a cleared segment."""
        item = f"item_{self.id}_{result.utterance}"
        if isinstance(result, p.Partial):
            await self._speech_started(result, item)
            await self._delta(result, item)
            return
        if result.reason in ("endpoint", "max_utterance") and self.config.vad:
            await self._speech_started(result, item)
            await self._event("input_audio_buffer.speech_stopped", audio_end_ms=_ms(result.end), item_id=item)
        elif result.reason == "end_of_stream" and not result.text:
            return
        await self._event("input_audio_buffer.committed", previous_item_id=self.previous_item, item_id=item)
        await self._delta(result, item)
        await self._event("conversation.item.input_audio_transcription.completed", item_id=item, content_index=0,
                          transcript=result.text,
                          usage={"type": "duration", "seconds": round(result.end - result.start, 3)})
        self.previous_item = item

    async def _speech_started(self, result: p.Partial | p.Final, item: str) -> None:
        if self.config.vad and self.spoken != result.utterance:
            self.spoken = result.utterance
            await self._event("input_audio_buffer.speech_started", audio_start_ms=_ms(result.start), item_id=item)

    async def _delta(self, result: p.Partial | p.Final, item: str) -> None:
        """Send what the text appends to the deltas sent so far; a revision waits for `completed`."""
        utterance, sent = self.deltas
        if utterance != result.utterance:
            sent = ""
        if len(result.text) > len(sent) and result.text.startswith(sent):
            await self._event("conversation.item.input_audio_transcription.delta", item_id=item, content_index=0,
                              delta=result.text[len(sent):])
            sent = result.text
        self.deltas = (result.utterance, sent)

    def _describe(self, beta: bool) -> dict[str, Any]:
        """The session object of ``*.created``/``*.updated``: the effective settings."""
        rules = self.config.start().endpointing.resolve(self.state.config.endpointing)
        turn = {"type": "server_vad", "silence_duration_ms": rules.silence_after_speech_ms} if self.config.vad else None
        transcription = {"model": self.state.model_name}
        if beta:
            return {"object": "realtime.transcription_session", "id": f"sess_{self.id}", "modalities": ["text"],
                    "input_audio_format": self.config.format, "input_audio_transcription": transcription,
                    "turn_detection": turn, "input_audio_noise_reduction": None, "include": None}
        fmt: dict[str, Any] = {"type": _GA_NAMES[self.config.format]}
        if self.config.format == "pcm16":
            fmt["rate"] = self.config.rate
        return {"object": "realtime.session", "id": f"sess_{self.id}", "type": "transcription",
                "audio": {"input": {"format": fmt, "transcription": transcription, "turn_detection": turn,
                                    "noise_reduction": None}},
                "include": None}

    async def _event(self, kind: str, **fields: Any) -> None:
        self.events += 1
        await self._send_text(json.dumps({"type": kind, "event_id": f"event_{self.id}_{self.events}", **fields},
                                         ensure_ascii=False, separators=(",", ":")))

    async def _error(self, e: RealtimeError, event_id: str | None = None, kind: str = "invalid_request_error") -> None:
        await self._event("error", error={"type": kind, "code": e.code, "message": e.message, "param": e.param,
                                          "event_id": event_id})

    async def _fail(self, exc: StreamdError) -> None:
        code, reason = p.close_for(exc)
        log.info("connection %s: %s: %s", self.log_id, exc.code, exc.message)
        try:
            if not isinstance(exc, SlowConsumer):  # a slow consumer is not reading: only the close frame
                await self._error(RealtimeError(exc.code, exc.message), None,
                                  "server_error" if code == p.CloseCode.INTERNAL_ERROR else "invalid_request_error")
            await self._close(code, reason)
        except (ConnectionClosed, SlowConsumer):
            self.ws.transport.abort()
