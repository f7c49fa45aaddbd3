"""The OpenAI Realtime transcription protocol without I/O: its client events parsed and checked,
the session settings (`SessionConfig`), and the events a stream's results become (`RealtimeFace`).
`server/realtime.py` serves it on ``/v1/realtime``; the module doc there says how it maps to the
native stream.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from streamd import protocol as p
from streamd.config import MAX_ENDPOINT_MS, EndpointingConfig
from streamd.errors import MAX_ECHO_CHARS, echo
from streamd.session.core import Result

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
EVENTS = ("session.update", "transcription_session.update", "input_audio_buffer.append",
          "input_audio_buffer.commit", "input_audio_buffer.clear")
_SERVER_VAD_KEYS = ("type", "silence_duration_ms", "threshold", "prefix_padding_ms", "create_response",
                    "interrupt_response", "idle_timeout_ms")
_TRANSCRIPTION_KEYS = ("model", "language", "prompt", "languages", "keywords", "delay")


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

def check_keys(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in allowed:
            param = (f"{where}.{key}" if where else key)[:2 * MAX_ECHO_CHARS]
            raise RealtimeError("unknown_parameter", f"unknown parameter {echo(param)}; streamd knows "
                                f"{', '.join(allowed)}", param)


def as_object(value: Any, param: str, nullable: bool = False) -> dict[str, Any] | None:
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
    if (obj := as_object(value, param, nullable=True)) is not None:
        check_keys(obj, keys, param)


def _include(value: Any, param: str) -> None:
    if value is None or value == []:
        return
    raise RealtimeError("unsupported", f"{param}: streamd sends no logprobs or other extra outputs", param)


def _turn_detection(config: SessionConfig, value: Any, param: str) -> SessionConfig:
    turn = as_object(value, param, nullable=True)
    if turn is None:
        return replace(config, vad=False, silence_ms=None)
    vad = turn.get("type")
    if vad == "semantic_vad":
        raise RealtimeError("unsupported", "semantic_vad is not supported; use server_vad (streamd's "
                            "endpointing) or null (commit turns yourself)", f"{param}.type")
    if vad != "server_vad":
        raise RealtimeError("invalid_value", f"{param}.type must be \"server_vad\", got {echo(vad)}",
                            f"{param}.type")
    check_keys(turn, _SERVER_VAD_KEYS, param)
    silence = turn.get("silence_duration_ms")
    if silence is not None:
        silence = _int(silence, f"{param}.silence_duration_ms", 1, MAX_ENDPOINT_MS)
    return replace(config, vad=True, silence_ms=silence)


def update_ga(config: SessionConfig, session: Mapping[str, Any]) -> SessionConfig:
    """Apply a ``session.update``'s session (the GA shape); only the fields present change."""
    check_keys(session, ("type", "audio", "include"), "session")
    session_type = session.get("type", "transcription")
    if session_type == "realtime":
        raise RealtimeError("unsupported", "conversation sessions are not supported: streamd only transcribes; "
                            "use \"type\": \"transcription\"", "session.type")
    if session_type != "transcription":
        raise RealtimeError("invalid_value", f"session.type must be \"transcription\", got {echo(session_type)}",
                            "session.type")
    _include(session.get("include"), "session.include")
    audio = as_object(session.get("audio", {}), "session.audio") or {}
    check_keys(audio, ("input",), "session.audio")
    where = "session.audio.input"
    audio_in = as_object(audio.get("input", {}), where) or {}
    check_keys(audio_in, ("format", "noise_reduction", "transcription", "turn_detection"), where)
    _ignored(audio_in.get("noise_reduction"), f"{where}.noise_reduction", ("type", "strength"))
    _ignored(audio_in.get("transcription"), f"{where}.transcription", _TRANSCRIPTION_KEYS)
    if "format" in audio_in:
        fmt = as_object(audio_in["format"], f"{where}.format") or {}
        check_keys(fmt, ("type", "rate"), f"{where}.format")
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
    check_keys(session, ("input_audio_format", "input_audio_transcription", "turn_detection",
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


def parse_event(data: str | bytes) -> dict[str, Any]:
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


def event_audio(event: Mapping[str, Any]) -> bytes:
    check_keys(event, ("type", "event_id", "audio"), "")
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


class RealtimeFace:
    """A Realtime session's state and events, without I/O: every event comes back as the JSON
    text to send. `result` maps a native result to events (see the module doc)."""

    def __init__(self, session_id: str, model_name: str, endpointing: EndpointingConfig) -> None:
        self.id, self.model_name, self.endpointing = session_id, model_name, endpointing
        self.config = SessionConfig()
        self.events = 0
        self.previous_item: str | None = None
        self.spoken = -1  # the last utterance whose speech_started was sent
        self.deltas: tuple[int, str] = (-1, "")  # an utterance and the text sent for it as deltas

    def event(self, kind: str, **fields: Any) -> str:
        self.events += 1
        return json.dumps({"type": kind, "event_id": f"event_{self.id}_{self.events}", **fields},
                          ensure_ascii=False, separators=(",", ":"))

    def error(self, e: RealtimeError, event_id: str | None = None, kind: str = "invalid_request_error") -> str:
        return self.event("error", error={"type": kind, "code": e.code, "message": e.message, "param": e.param,
                                          "event_id": event_id})

    def describe(self, beta: bool) -> dict[str, Any]:
        """The session object of ``*.created``/``*.updated``: the effective settings."""
        rules = self.config.start().endpointing.resolve(self.endpointing)
        turn = {"type": "server_vad", "silence_duration_ms": rules.silence_after_speech_ms} if self.config.vad else None
        transcription = {"model": self.model_name}
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

    def result(self, result: Result) -> list[str]:
        """The events of a native result (a cleared segment's results never come here)."""
        item = f"item_{self.id}_{result.utterance}"
        out: list[str] = []
        if isinstance(result, p.Partial):
            self._speech_started(result, item, out)
            self._delta(result, item, out)
            return out
        if result.reason in ("endpoint", "max_utterance") and self.config.vad:
            self._speech_started(result, item, out)
            out.append(self.event("input_audio_buffer.speech_stopped", audio_end_ms=_ms(result.end), item_id=item))
        elif result.reason == "end_of_stream" and not result.text:
            return out
        out.append(self.event("input_audio_buffer.committed", previous_item_id=self.previous_item, item_id=item))
        self._delta(result, item, out)
        out.append(self.event("conversation.item.input_audio_transcription.completed", item_id=item, content_index=0,
                              transcript=result.text,
                              usage={"type": "duration", "seconds": round(result.end - result.start, 3)}))
        self.previous_item = item
        return out

    def _speech_started(self, result: p.Partial | p.Final, item: str, out: list[str]) -> None:
        if self.config.vad and self.spoken != result.utterance:
            self.spoken = result.utterance
            out.append(self.event("input_audio_buffer.speech_started", audio_start_ms=_ms(result.start), item_id=item))

    def _delta(self, result: p.Partial | p.Final, item: str, out: list[str]) -> None:
        """What the text appends to the deltas sent so far; a revision waits for `completed`."""
        utterance, sent = self.deltas
        if utterance != result.utterance:
            sent = ""
        if len(result.text) > len(sent) and result.text.startswith(sent):
            out.append(self.event("conversation.item.input_audio_transcription.delta", item_id=item, content_index=0,
                                  delta=result.text[len(sent):]))
            sent = result.text
        self.deltas = (result.utterance, sent)
