"""Deepgram's live transcription protocol on ``/v1/listen``: a face of a `Connection`
(`server/handler.py`).

A listen session is served as a native stream is, with Deepgram's messages: the same engine
segments, endpointing, limits and timeouts. The query string is the native ``start`` (checked at the
handshake: a bad or unsupported value is an HTTP 400 there); binary messages are audio; ``Finalize``
is ``finalize``; ``CloseStream`` (or an empty binary message) is ``stop``; ``KeepAlive`` only resets
the idle timer. Results map to ``Results`` messages (partials: ``is_final`` false; finals:
``is_final`` true, ``speech_final`` for an endpoint, ``from_finalize`` for a ``Finalize``), with
``SpeechStarted`` and ``UtteranceEnd`` when asked for, and ``Metadata`` before the close. Options
streamd cannot honour but that leave the transcript usable (``punctuate=true``, ``keywords``...) are
reported in a non-fatal ``Error`` message at the start and in ``Metadata``; bad client messages get
a non-fatal ``Error`` and the session goes on. ``docs/protocol.md`` has the user-facing description.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http import HTTPStatus
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import numpy as np
from websockets.http11 import Response

from streamd import protocol as p
from streamd.config import MAX_ENDPOINT_MS
from streamd.errors import StreamdError, echo
from streamd.server.handler import Connection
from streamd.server.http import response
from streamd.server.realtime import G711
from streamd.session.core import Result

Encoding = Literal["linear16", "mulaw", "alaw"]
_G711: dict[str, Literal["g711_ulaw", "g711_alaw"]] = {"mulaw": "g711_ulaw", "alaw": "g711_alaw"}
CHANNEL_INDEX = [0, 1]  # channel 0 of 1: streamd transcribes mono
# Accepted and honoured, or with no effect on what a stream returns (see docs/protocol.md).
_ACCEPTED = ("encoding", "sample_rate", "channels", "multichannel", "interim_results", "endpointing",
             "utterance_end_ms", "vad_events", "model", "language", "version", "mip_opt_out", "tag", "extra",
             "no_delay", "token")
# Formatting and analysis features: `false` is what streamd does; `true` is reported, not done.
_FEATURES = ("punctuate", "smart_format", "profanity_filter", "numerals", "dictation", "diarize", "filler_words",
             "detect_entities", "measures", "paragraphs", "utterances", "detect_language", "sentiment", "topics",
             "intents", "summarize")
# Refused: results would go elsewhere, or a client relies on them for safety.
# Deepgram parameters streamd knows and does not implement: reported as unsupported, not unknown.
_KNOWN_UNSUPPORTED = ("keywords", "keyterm", "search", "replace", "diarize_model", "language_hint", "alternatives")
_REFUSED = {"callback": "streamd sends results on this websocket only; drop callback",
            "callback_method": "streamd sends results on this websocket only; drop callback_method",
            "redact": "streamd does not redact; refusing rather than returning unredacted text"}


class ListenError(Exception):
    """A client message streamd rejects: answered with a non-fatal ``Error`` message."""

    def __init__(self, variant: str, description: str, message: str | None = None) -> None:
        super().__init__(description)
        self.variant, self.description, self.message = variant, description, message


class BadQuery(Exception):
    """A query parameter the handshake refuses (HTTP 400)."""


@dataclass(frozen=True)
class Unsupported:
    """An option accepted but not honoured: reported to the client (a warning)."""

    parameter: str
    message: str


@dataclass(frozen=True)
class ListenOptions:
    """What a ``/v1/listen`` query asks for, checked."""

    encoding: Encoding
    sample_rate: int
    interim_results: bool = False
    endpointing: int | bool = True  # ms of silence after speech; True: the server's rule; False: off
    utterance_end_ms: int | None = None
    vad_events: bool = False
    model: str | None = None
    language: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[Unsupported, ...] = ()

    def start(self) -> p.Start:
        """The native ``start`` this session is served as (G.711 is decoded to 16-bit PCM first)."""
        if self.endpointing is False:  # no endpoint finals; the server's other rules stay
            endpointing = p.EndpointingOptions(silence_after_speech_ms=0)
        elif self.endpointing is True:
            endpointing = p.EndpointingOptions()
        else:
            endpointing = p.EndpointingOptions(silence_after_speech_ms=self.endpointing)
        return p.Start(sample_rate=self.sample_rate, encoding="s16le", interim_results=self.hears_partials,
                       word_times=True, endpointing=endpointing)

    @property
    def hears_partials(self) -> bool:
        """Whether the session's partials matter: interim ``Results``, or the words that time
        ``SpeechStarted`` and ``UtteranceEnd``. Without them a step costs what a native one does."""
        return self.interim_results or self.vad_events or self.utterance_end_ms is not None


# -- the query --------------------------------------------------------------------------------

def _bool(name: str, value: str) -> bool:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise BadQuery(f"{name} must be true or false, got {echo(value)}")


def _int(name: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise BadQuery(f"{name} must be an integer, got {echo(value)}") from None
    if not low <= number <= high:
        raise BadQuery(f"{name} must be in {low}..{high}, got {number}")
    return number


def parse_options(path: str) -> ListenOptions:
    """The options of a ``/v1/listen`` request path (with its query).

    Raises:
        BadQuery: a value streamd refuses (the handshake answers HTTP 400 with it).
    """
    query = parse_qs(urlsplit(path).query, keep_blank_values=True)
    one = {k: v[-1] for k, v in query.items()}
    for name, why in _REFUSED.items():
        if name in one and not (name == "redact" and one[name].lower() == "false"):
            raise BadQuery(f"{name} is not supported: {why}")
    encoding = one.get("encoding")
    if encoding is None:
        raise BadQuery("encoding is required: streamd takes raw audio (linear16, mulaw or alaw), not containers")
    if encoding not in ("linear16", "mulaw", "alaw"):
        raise BadQuery(f"encoding {echo(encoding)} is not supported; use linear16, mulaw or alaw")
    if "sample_rate" not in one:
        raise BadQuery("sample_rate is required with encoding")
    rate = _int("sample_rate", one["sample_rate"], p.MIN_SAMPLE_RATE, p.MAX_SAMPLE_RATE)
    if (channels := one.get("channels", "1")) != "1":
        raise BadQuery(f"channels={echo(channels)} is not supported: streamd transcribes one channel; send mono "
                       "audio, or one stream per channel")
    if "multichannel" in one:
        _bool("multichannel", one["multichannel"])  # with one channel, either value is honoured
    endpointing: int | bool = True
    if "endpointing" in one:
        value = one["endpointing"]
        endpointing = (_bool("endpointing", value) if value.lower() in ("true", "false")
                       else _int("endpointing", value, 1, MAX_ENDPOINT_MS))
    utterance_end = None
    if "utterance_end_ms" in one:
        utterance_end = _int("utterance_end_ms", one["utterance_end_ms"], 1, MAX_ENDPOINT_MS)
    extra: dict[str, str] = {}
    for item in query.get("extra", []):
        key, sep, value = item.partition(":")
        if not sep or not key:
            raise BadQuery(f"extra must be key:value, got {echo(item)}")
        extra[key] = value
    warnings: list[Unsupported] = []
    for name, values in query.items():
        if name in _ACCEPTED or name in _REFUSED:
            continue
        if name in _FEATURES:
            if not _bool(name, values[-1]):
                continue  # false: what streamd does anyway
            why = f"{name}=true is not supported: streamd returns the model's words as they are"
        else:
            why = (f"{name} is not supported" if name in _KNOWN_UNSUPPORTED else f"unknown parameter {name}")
            why += " and was ignored"
        warnings.append(Unsupported(name[:64], why[:200]))
    return ListenOptions(encoding, rate,  # type: ignore[arg-type]  # checked above
                         interim_results=_bool("interim_results", one.get("interim_results", "false")),
                         endpointing=endpointing, utterance_end_ms=utterance_end,
                         vad_events=_bool("vad_events", one.get("vad_events", "false")),
                         model=one.get("model"), language=one.get("language"), extra=extra,
                         warnings=tuple(warnings[:16]))


def listen_refusal(path: str) -> Response | None:
    """The HTTP 400 for a ``/v1/listen`` handshake whose query streamd refuses, as Deepgram
    answers it (JSON body, ``dg-error`` header); None when the query is acceptable."""
    try:
        parse_options(path)
    except BadQuery as e:
        body = {"err_code": "INVALID_QUERY_PARAMETER", "err_msg": str(e)}
        return response(HTTPStatus.BAD_REQUEST, (json.dumps(body) + "\n").encode(), "application/json",
                        extra={"dg-error": str(e).encode("ascii", "replace").decode()})
    return None


def _version() -> str:
    try:
        return importlib.metadata.version("streamd")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


def _parse(data: str) -> dict[str, Any]:
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        raise ListenError("SchemaError", "message is not valid JSON", data[:200]) from None
    if not isinstance(message, dict):
        raise ListenError("SchemaError", "message must be a JSON object", data[:200])
    return message


# -- the messages --------------------------------------------------------------------------------

def _json(body: Any) -> str:
    """A server message's JSON text (compact, UTF-8 as is)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


class ResultsJson:
    """The ``Results`` messages of one stream as JSON text. Every partial repeats the words of the
    utterance so far, so each word's JSON is encoded once and kept while the messages still carry
    it (the words of the last message); the text is what encoding the whole message would give."""

    def __init__(self, metadata: Mapping[str, Any]) -> None:
        self._metadata = _json(metadata)  # the same in every message
        self._words: dict[tuple[str, float, float], str] = {}  # a word's value: its JSON

    def encode(self, result: Result, words: tuple[p.Word, ...]) -> str:
        """`result` with `words` (a partial's from the session, a final's its own)."""
        final = isinstance(result, p.Final)
        reason = result.reason if isinstance(result, p.Final) else None
        text = result.text
        head = _json({"type": "Results", "channel_index": CHANNEL_INDEX,
                      "duration": round(result.end - result.start, 3), "start": round(result.start, 3),
                      "is_final": final, "speech_final": reason == "endpoint",
                      "from_finalize": reason == "finalize"})
        alternative = _json({"transcript": text, "confidence": 1.0 if text else 0.0})
        known, self._words = self._words, {}
        fragments = []
        for w in words:
            # a word's value, hashed in C (a Word's hash is Python); stream times are never -0.0,
            # the one float that equals another and encodes differently
            key = (w.word, w.start, w.end)
            fragment = known.get(key) or self._words.get(key) or _json(
                {"word": w.word, "start": w.start, "end": w.end, "confidence": 1.0, "punctuated_word": w.word})
            self._words[key] = fragment
            fragments.append(fragment)
        words_json = ",".join(fragments)
        return (f'{head[:-1]},"channel":{{"alternatives":[{alternative[:-1]},"words":[{words_json}]}}]}},'
                f'"metadata":{self._metadata}}}')


# -- the face ----------------------------------------------------------------------------------

class ListenStream:
    """The ``/v1/listen`` face of a connection (`handler.Face`): Deepgram's live messages. The
    stream starts at the handshake, with the format and options of the query."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.session = conn, conn.session
        assert conn.ws.request is not None
        self.options = parse_options(conn.ws.request.path)  # the handshake checked it
        self.request_id = str(uuid.uuid4())
        self.created = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        model_name = conn.state.model_name
        self.model_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, "streamd:" + model_name))
        self.sha256 = hashlib.sha256()
        self.announced = -1  # the last utterance whose SpeechStarted was sent
        self.heard_s = 0.0  # stream time of the end of the last word heard (interim or final)
        self.heard_pending = False  # words heard since the last UtteranceEnd
        model_info = {"name": model_name, "version": _version(), "arch": "streamd"}
        self.result_metadata: dict[str, Any] = {"request_id": self.request_id, "model_info": model_info,
                                                "model_uuid": self.model_uuid}
        if self.options.extra:
            self.result_metadata["extra"] = dict(self.options.extra)
        self.results = ResultsJson(self.result_metadata)

    async def serve(self) -> str:
        conn = self.conn
        for w in self.options.warnings:
            await self._error(ListenError("UnsupportedParameter", w.message, w.parameter))
        self.session.begin(self.options.start())
        reason = "shutdown"
        with conn.serving():
            await conn.run_commands()  # open the first segment
            sender = conn.start_sender()
            while (data := await conn.next_message()) is not None:
                closing = await self.handle(data)
                del data  # taken: the next receive waits without it
                if closing:
                    reason = "close stream"
                    break
            self.session.end()
            await conn.run_commands()
            await sender
        await self._send_json(self._metadata())
        await conn.close(p.CloseCode.NORMAL_CLOSURE if reason == "close stream" else p.CloseCode.GOING_AWAY)
        return reason

    async def handle(self, data: str | bytes) -> bool:
        """Take one client message; True for the end of the stream (``CloseStream``)."""
        if isinstance(data, bytes):
            if not data:  # Deepgram's older way to close a stream
                return True
            await self._audio(data)
            return False
        try:
            message = _parse(data)
            message_type = message.get("type")
            if message_type == "CloseStream":
                return True
            if message_type == "Finalize":
                if message.get("channel", 0) != 0:
                    raise ListenError("SchemaError", f"Finalize channel must be 0 (streamd transcribes one "
                                      f"channel), got {echo(message.get('channel'))}", data[:200])
                self.session.finalize()
                await self.conn.run_commands()
            elif message_type != "KeepAlive":
                raise ListenError("SchemaError", f"unknown message type {echo(message_type)}; streamd takes KeepAlive, "
                                  "Finalize and CloseStream (and binary audio)", data[:200])
        except ListenError as e:
            await self._error(e)
        return False

    async def _audio(self, data: bytes) -> None:
        self.sha256.update(data)
        table = G711[_G711[self.options.encoding]] if self.options.encoding != "linear16" else None
        # on shutdown, the next receive ends the loop
        await self.conn.feed(data, None if table is None else lambda b: table[np.frombuffer(b, np.uint8)].tobytes())

    # -- results ---------------------------------------------------------------------------------
    async def delivered(self) -> None:
        """An ``UtteranceEnd`` once decoding went on long enough without words."""
        if self.heard_pending and self._pause_ended(self.session.decoded_s):
            await self._utterance_end()

    def _pause_ended(self, until_s: float) -> bool:
        """The time since the last word heard, up to `until_s`, reached ``utterance_end_ms``."""
        end_ms = self.options.utterance_end_ms
        return end_ms is not None and until_s - self.heard_s >= end_ms / 1000

    async def _utterance_end(self) -> None:
        self.heard_pending = False
        await self._send_json({"type": "UtteranceEnd", "channel": CHANNEL_INDEX, "last_word_end": round(self.heard_s, 3)})

    async def _heard(self, words: tuple[p.Word, ...]) -> None:
        """Words of a result (interim or final): an UtteranceEnd first if a long enough pause
        preceded the new ones (a step may hold both the pause and the words after it)."""
        new = [w for w in words if w.end > self.heard_s]
        if new:
            if self.heard_pending and self._pause_ended(new[0].start):
                await self._utterance_end()
            self.heard_s, self.heard_pending = new[-1].end, True

    async def deliver(self, result: Result) -> None:
        """Map a native result to Deepgram messages (see the module doc)."""
        final = isinstance(result, p.Final)
        words = (result.words or ()) if isinstance(result, p.Final) else self.session.open_words()
        if words:
            await self._heard(words)
            if self.options.vad_events and self.announced < result.utterance:
                await self._send_json({"type": "SpeechStarted", "channel": CHANNEL_INDEX,
                                       "timestamp": words[0].start})
            self.announced = max(self.announced, result.utterance)
        if not final and not self.options.interim_results:
            return
        await self.conn.send_text(self.results.encode(result, words))

    def _metadata(self) -> dict[str, Any]:
        """The last message before the close: the stream's request, audio and model."""
        return {"type": "Metadata", "transaction_key": "deprecated", "request_id": self.request_id,
                "sha256": self.sha256.hexdigest(), "created": self.created,
                "duration": round(self.session.received_s, 3), "channels": 1, "models": [self.model_uuid],
                "model_info": {self.model_uuid: self.result_metadata["model_info"]},
                "requested": {"model": self.options.model, "language": self.options.language},
                "warnings": [{"parameter": w.parameter, "type": "unsupported", "message": w.message}
                             for w in self.options.warnings]}

    # -- sending -----------------------------------------------------------------------------------
    async def report(self, error: StreamdError) -> None:
        """An ``Error`` message with the error's code and message."""
        await self._error(ListenError(error.code, error.message))

    async def _send_json(self, body: dict[str, Any]) -> None:
        await self.conn.send_text(_json(body))

    async def _error(self, e: ListenError) -> None:
        body = {"type": "Error", "variant": e.variant, "description": e.description}
        if e.message is not None:
            body["message"] = e.message
        await self._send_json(body)
