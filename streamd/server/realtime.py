"""The OpenAI Realtime transcription protocol on ``/v1/realtime``: a face of a `Connection`
(`server/handler.py`).

A realtime session is served as a native stream is, with other events: the same engine segments,
endpointing, limits and timeouts. ``session.update`` (or the beta ``transcription_session.update``)
becomes the native ``start``; ``input_audio_buffer.append`` is a binary audio message; ``commit`` is
``finalize``; ``clear`` ends the segment and drops its results. Results map to events: the first
partial of an utterance is ``speech_started`` (server VAD), partials are ``delta`` events of the
text they append, an endpoint final is ``speech_stopped`` + ``committed`` + ``completed``. Errors in
client events are answered with an ``error`` event and the session goes on. ``docs/protocol.md`` has
the user-facing description.
The protocol itself, without I/O, is `streamd.session.realtime`; here is its face.
"""
from __future__ import annotations

from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import numpy as np
import numpy.typing as npt

from streamd.errors import StreamdError, echo
from streamd import protocol as p
from streamd.server.handler import Connection
from streamd.session.core import Result
from streamd.session.realtime import (EVENTS, UNSUPPORTED_EVENTS, AudioFormat, RealtimeError, RealtimeFace, as_object,
                                      check_keys, event_audio, parse_event, update_beta, update_ga)


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


# -- the face ----------------------------------------------------------------------------------

class RealtimeStream:
    """The ``/v1/realtime`` face of a connection (`handler.Face`): Realtime transcription events.

    The engine stream starts at the first ``append``; the session settings are fixed from then on.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn, self.session = conn, conn.session
        request = conn.ws.request
        assert request is not None
        self.beta = "realtime=v1" in request.headers.get("OpenAI-Beta", "")
        self.intent = parse_qs(urlsplit(request.path).query).get("intent", ["transcription"])[-1]
        self.events = RealtimeFace(conn.id, conn.state.model_name, conn.state.config.endpointing)
        self.appended = False  # audio since the last commit or clear

    async def serve(self) -> str:
        conn = self.conn
        await self._event("transcription_session.created" if self.beta else "session.created",
                          session=self.events.describe(self.beta))
        if self.intent != "transcription":
            await self._error(RealtimeError("unsupported", f"intent={echo(self.intent)} is not supported: streamd "
                                            "only transcribes (intent=transcription)", "intent"))
            await conn.close(p.CloseCode.POLICY_VIOLATION, "only intent=transcription is supported")
            return "unsupported intent"
        with conn.serving():
            while (data := await conn.next_message()) is not None:
                if conn.sender is not None and conn.sender.done():
                    conn.sender.result()  # raises what ended it
                audio = await self.handle(data)
                del data  # the event is let go of before its audio is fed (and paced)
                if audio:
                    await self.append(audio)
                del audio
            await self._drain()
        await conn.close(p.CloseCode.GOING_AWAY)
        return "shutdown"

    async def handle(self, data: str | bytes) -> bytes | None:
        """Take one client event; an `append`'s audio is returned (decoded), for the caller to
        feed once it has let go of the event."""
        event_id: str | None = None
        try:
            event = parse_event(data)
            event_id = event.get("event_id")
            return await self._dispatch(event)
        except RealtimeError as e:
            await self._error(e, event_id)
            return None

    async def _dispatch(self, event: dict[str, Any]) -> bytes | None:
        event_type = event.get("type")
        if event_type == "input_audio_buffer.append":
            return event_audio(event)
        if event_type in ("input_audio_buffer.commit", "input_audio_buffer.clear"):
            check_keys(event, ("type", "event_id"), "")
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
            check_keys(event, ("type", "event_id", "session"), "")
            if "session" not in event:
                raise RealtimeError("missing_required_parameter", f"{event_type} needs \"session\"", "session")
            session = as_object(event["session"], "session") or {}
            config = (update_beta if beta else update_ga)(self.events.config, session)
            if self.session.start is not None and config != self.events.config:
                raise RealtimeError("session_update_after_audio", "the audio format and turn detection cannot "
                                    "change once audio was appended; open a new session", "session")
            self.events.config = config
            await self._event(f"{event_type}d", session=self.events.describe(beta))
        elif event_type in UNSUPPORTED_EVENTS:
            raise RealtimeError("unsupported", f"{event_type} is not supported: streamd only transcribes (no "
                                "conversation items, no responses)", "type")
        else:
            raise RealtimeError("unknown_event", f"unknown event type {echo(event_type)}; streamd takes "
                                f"{', '.join(EVENTS)}", "type")
        return None

    async def append(self, audio: bytes) -> None:
        """Feed an ``append``'s audio; the first one starts the stream."""
        if not audio:
            return
        if self.session.start is None:
            self.session.begin(self.events.config.start())
            await self.conn.run_commands()  # open the first segment
            self.conn.start_sender()
        table = G711[self.events.config.format] if self.events.config.format != "pcm16" else None
        self.appended = True
        # on shutdown, the next receive ends the loop
        await self.conn.feed(audio, None if table is None else lambda b: table[np.frombuffer(b, np.uint8)].tobytes())

    async def _next_segment(self, reason: Literal["finalize", "clear"]) -> None:
        """End the open segment (`finalize`: transcribe it; `clear`: drop its results) and open the next."""
        self.session.finalize(reason)
        await self.conn.run_commands()
        self.appended = False

    async def _drain(self) -> None:
        """Shutting down: transcribe the audio not yet committed, then let the sender finish."""
        if self.session.segment is None or self.conn.sender is None:
            return
        self.session.end()
        await self.conn.run_commands()
        await self.conn.sender

    async def deliver(self, result: Result) -> None:
        """Send a native result as realtime events (the session drops the results of a cleared
        segment)."""
        for text in self.events.result(result):
            await self.conn.send_text(text)

    async def delivered(self) -> None:
        """Nothing more: events answer results only."""

    async def report(self, error: StreamdError) -> None:
        """An ``error`` event (``server_error`` for an internal error)."""
        code, _ = p.close_for(error)
        await self._error(RealtimeError(error.code, error.message), None,
                          "server_error" if code == p.CloseCode.INTERNAL_ERROR else "invalid_request_error")

    async def _event(self, kind: str, **fields: Any) -> None:
        await self.conn.send_text(self.events.event(kind, **fields))

    async def _error(self, e: RealtimeError, event_id: str | None = None, kind: str = "invalid_request_error") -> None:
        await self.conn.send_text(self.events.error(e, event_id, kind))
