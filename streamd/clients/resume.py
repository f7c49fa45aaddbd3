"""Streams that survive a dropped connection, a killed daemon or a handoff, losing no words.

:class:`ResumingStream` keeps what the server may still need in a :class:`ReplayBuffer`: the
audio and ``finalize`` messages sent since the last point where the server's decoder state was
fresh (the stream's start, or the last ``finalize`` once its final came back). When the
connection is lost without a ``summary`` it reconnects (through a load balancer, with
``?session=ID`` so that it can route back) and sends ``start`` with
``resume: {session_id, secret, last_seq}`` (the secret from ``ready``; it is never put in a URL):

- the same daemon still holds the session: it answers ``resumed`` with the audio bytes and
  ``finalize`` messages it has, replays the results after ``last_seq``, and the client resends
  only what the daemon did not get;
- any other answer is a new session (``ready``): the client replays the whole buffer and drops
  the results it already has (utterances are numbered from the buffer's start, times shifted),
  so the transcript is the one an undisturbed stream gives: decoding is deterministic and starts
  from the same fresh state.

Memory: the buffer is bounded by ``max_replay_s`` seconds of audio. Past that, it is cut after
the last final; a replay then starts from a fresh decoder state mid-stream, so the words just
after the cut may differ from an undisturbed stream's (still no gap, no repeated utterance).
docs/protocol.md ("Resume") describes the protocol; this is its reference client.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from streamd.clients.common import (Backoff, ConnectionLost, StreamError, explain, handshake, retry_delay,
                                     stream_url)
from streamd.errors import ProtocolViolation
from streamd.protocol import (TAKEN_OVER_CLOSE, Error, Final, Finalize, Partial, Ready, Resume, Resumed, Start,
                             Stop, Summary, Word, encode_client_message, parse_server_message)

MAX_REPLAY_S = 600.0
RECONNECT_ATTEMPTS = 8  # consecutive failed reconnections before giving up
FINALIZE = None  # a `finalize` in the buffer


@dataclass
class _Item:
    offset: int  # absolute audio byte offset where it was sent
    pcm: bytes | None  # None: a `finalize`
    ordinal: int = 0  # for a `finalize`: 1 for the stream's first


class ReplayBuffer:
    """Audio and ``finalize`` messages since the last fresh-state point, at absolute positions."""

    def __init__(self, frame_bytes: int, rate: int, max_bytes: int) -> None:
        self.frame_bytes, self.bytes_per_second, self.max_bytes = frame_bytes, frame_bytes * rate, max_bytes
        self.items: list[_Item] = []
        self.total_bytes = 0  # audio bytes sent since the stream began
        self.finalizes = 0  # `finalize` messages sent since the stream began
        self.base_bytes = 0  # audio before this was dropped
        self.base_utterance = 0  # the utterance a new session's first one is
        self.held = 0  # audio bytes held

    @property
    def base_seconds(self) -> float:
        return self.base_bytes / self.bytes_per_second

    def audio(self, pcm: bytes) -> None:
        self.items.append(_Item(self.total_bytes, pcm))
        self.total_bytes += len(pcm)
        self.held += len(pcm)

    def finalize(self) -> None:
        self.finalizes += 1
        self.items.append(_Item(self.total_bytes, FINALIZE, self.finalizes))

    def after(self, audio_bytes: int, finalizes: int) -> list[bytes | None] | None:
        """What a daemon that got `audio_bytes` and `finalizes` still needs, in order; None if
        some of it is no longer held."""
        if audio_bytes < self.base_bytes or audio_bytes > self.total_bytes:
            return None
        out: list[bytes | None] = []
        for item in self.items:
            if item.pcm is None:
                if item.ordinal > finalizes:
                    out.append(FINALIZE)
            elif item.offset + len(item.pcm) > audio_bytes:
                out.append(item.pcm[max(0, audio_bytes - item.offset):])
        return out

    def everything(self) -> list[bytes | None]:
        """What a new session needs."""
        return [item.pcm for item in self.items]

    def fresh_after(self, ordinal: int, next_utterance: int) -> None:
        """The final of `finalize` number `ordinal` came: the server's next segment started
        from a fresh state there, so a replay can start there too."""
        for i, item in enumerate(self.items):
            if item.pcm is None and item.ordinal == ordinal:
                self._cut(i + 1, item.offset, next_utterance)
                return

    def bound(self, final: Final) -> None:
        """Over `max_bytes`: drop what precedes the end of `final` (an approximate replay point)."""
        cut = int(final.end * self.bytes_per_second)
        cut -= cut % self.frame_bytes
        if self.held <= self.max_bytes or cut <= self.base_bytes:
            return
        keep: list[_Item] = []
        for item in self.items:
            if item.pcm is None:
                if item.offset >= cut:
                    keep.append(item)
            elif item.offset + len(item.pcm) > cut:
                skip = max(0, cut - item.offset)
                keep.append(_Item(item.offset + skip, item.pcm[skip:]))
        self.items = keep
        self.base_bytes, self.base_utterance = cut, final.utterance + 1
        self.held = sum(len(i.pcm) for i in keep if i.pcm is not None)

    def _cut(self, index: int, offset: int, next_utterance: int) -> None:
        self.items = self.items[index:]
        self.base_bytes, self.base_utterance = offset, next_utterance
        self.held = sum(len(i.pcm) for i in self.items if i.pcm is not None)


def _frame_bytes(start: Start) -> int:
    return (2 if start.encoding == "s16le" else 4) * start.channels


def with_session(url: str, session_id: str) -> str:
    """`url` with `session=ID` in its query: a load balancer routes the resume by it."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "session"] + [("session", session_id)]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


class ResumingStream:
    """One stream that reconnects and resumes by itself; use as an async context manager.

    Send with :meth:`send_audio`, :meth:`finalize` and :meth:`stop`; iterate :meth:`results`
    for partials and finals (utterance numbers and times as in one undisturbed session) until
    the summary. `on_status` is told about reconnections.

    Entering makes one attempt to connect (callers retry it as they see fit); a lost connection
    is retried `attempts` times in a row (None: for ever) before `results` gives up.

    Raises (from `results` or entering):
        ServerBusy, StreamError: the daemon refused (503 or another status), sent an ``error``, or
            a refusal that retrying cannot fix came while reconnecting.
        OSError, TimeoutError, ConnectionLost: the daemon could not be reached (the last error
            after `attempts` attempts).
    """

    def __init__(self, url: str, start: Start, cafile: str | None = None, token: str | None = None,
                 max_replay_s: float = MAX_REPLAY_S, open_timeout: float = 10.0,
                 on_status: Callable[[str], None] | None = None, attempts: int | None = RECONNECT_ATTEMPTS) -> None:
        self.url, self.start, self.cafile, self.token = stream_url(url), dataclasses.replace(start, resume=None), cafile, token
        self.open_timeout, self.attempts = open_timeout, attempts
        self._on_status = on_status or (lambda message: None)
        frame = _frame_bytes(start)
        self.buffer = ReplayBuffer(frame, start.sample_rate, int(max_replay_s * frame * start.sample_rate))
        self.ready: Ready | None = None
        self.summary: Summary | None = None
        self.resumed = 0  # reconnections that resumed the session on the same daemon
        self.replayed = 0  # reconnections that replayed the buffer to a new session
        self._ws: ClientConnection | None = None  # None while reconnecting
        self._lock = asyncio.Lock()
        self._last_seq = -1
        self._base_utterance, self._base_seconds = 0, 0.0
        self._next_utterance = 0
        self._finalize_finals = 0
        self._partials = 0
        self._stopped = False
        self._started = time.monotonic()
        self._resender: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ResumingStream:
        ws, first = await self._open(self.start)
        if not isinstance(first, Ready):
            await ws.close()
            raise StreamError("bad_reply", f"expected ready, got {first.type}")
        self.ready, self._ws = first, ws
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._resender is not None:
            self._resender.cancel()
            await asyncio.gather(self._resender, return_exceptions=True)
        if self._ws is not None:
            await self._ws.close()

    async def send_audio(self, pcm: bytes) -> None:
        """One binary message of PCM in the format declared in ``start``."""
        async with self._lock:
            self.buffer.audio(pcm)
            await self._send(pcm)

    async def finalize(self) -> None:
        """End the current utterance now (``finalize``)."""
        async with self._lock:
            self.buffer.finalize()
            await self._send(encode_client_message(Finalize()))

    async def stop(self) -> None:
        """No more audio: the last final and the summary follow."""
        async with self._lock:
            self._stopped = True
            await self._send(encode_client_message(Stop()))

    async def _send(self, message: str | bytes) -> None:
        if self._ws is None:
            return  # reconnecting: the buffer has it
        try:
            await self._ws.send(message)
        except ConnectionClosed:
            pass  # `results` notices and reconnects; the buffer has it

    async def results(self) -> AsyncIterator[Partial | Final]:
        """Partials and finals until the summary (kept in :attr:`summary`)."""
        while True:
            ws = self._ws
            assert ws is not None
            last: Final | None = None  # an `end_of_stream` final waits for the summary's reason
            try:
                async for text in ws:
                    seq, message = _parse(str(text))
                    if isinstance(message, Error):
                        raise StreamError(message.code, message.message)
                    if isinstance(message, Final) and message.reason == "end_of_stream":
                        last = message  # not acknowledged: a resume gets it again
                        continue
                    self._last_seq = seq
                    if isinstance(message, Summary):
                        if message.reason == "stop":
                            if last is not None and (result := self._map(last)) is not None:
                                yield result
                            self.summary = dataclasses.replace(
                                message, utterances=self._next_utterance, partials=self._partials,
                                audio_seconds=round(self.buffer.total_bytes / self.buffer.bytes_per_second, 3),
                                session_seconds=round(time.monotonic() - self._started, 3))
                            return
                        # The daemon shut down: `last` cut the utterance short. The daemon that
                        # gets the replay transcribes it whole.
                        why = "the daemon shut down"
                        break
                    if isinstance(message, (Partial, Final)) and (result := self._map(message)) is not None:
                        yield result
                else:
                    why = f"connection closed (code {ws.close_code})"
            except ConnectionClosed:
                why = f"connection lost (code {ws.close_code})"
            if ws.close_code == TAKEN_OVER_CLOSE:
                raise StreamError("session_taken_over", "the session was resumed on another connection")
            self._ws = None
            await self._reconnect(why)

    def _map(self, r: Partial | Final) -> Partial | Final | None:
        """A result in the stream's numbering and times; None if already delivered."""
        utterance = self._base_utterance + r.utterance
        if utterance < self._next_utterance:
            return None
        shift = self._base_seconds
        moved = dataclasses.replace(r, utterance=utterance, start=round(r.start + shift, 3),
                                    end=round(r.end + shift, 3), audio_processed=round(r.audio_processed + shift, 3))
        if isinstance(moved, Partial):
            self._partials += 1
            return moved
        if moved.words is not None:
            moved = dataclasses.replace(moved, words=tuple(Word(w.word, round(w.start + shift, 3), round(w.end + shift, 3))
                                                           for w in moved.words))
        self._next_utterance = utterance + 1
        if moved.reason == "finalize":
            self._finalize_finals += 1
            self.buffer.fresh_after(self._finalize_finals, self._next_utterance)
        else:
            self.buffer.bound(moved)
        return moved

    async def _reconnect(self, why: str) -> None:
        """Resume the session, or replay the buffer to a new one."""
        backoff = Backoff(initial=0.1)
        session_id = self.ready.session_id if self.ready else ""
        secret = (self.ready.resume_secret if self.ready else None) or ""
        self._on_status(f"{why}; resuming session {session_id}")
        failures = 0
        while True:
            try:
                start = dataclasses.replace(self.start, resume=Resume(session_id, max(self._last_seq, 0), secret))
                ws, first = await self._open(start, with_session(self.url, session_id))
            except Exception as e:
                failures += 1
                await self._wait_retry(e, backoff, failures)
                continue
            # Held until the buffer is resent, so that new audio goes after it. The resend runs
            # beside `results`, which reads the answers meanwhile (a long replay is paced by the
            # daemon, whose results must not pile up unread).
            await self._lock.acquire()
            if isinstance(first, Resumed):
                todo = self.buffer.after(first.audio_bytes, first.finalizes)
                if todo is None:  # cannot happen with a daemon that keeps its word
                    self._lock.release()
                    await ws.close()
                    raise StreamError("resume_failed", "the daemon needs audio no longer held")
                self.resumed += 1
                self._on_status(f"resumed session {session_id}: resending {first.audio_bytes} -> "
                                f"{self.buffer.total_bytes} bytes")
            else:
                self.ready = first
                self._last_seq = 0
                self._base_utterance, self._base_seconds = self.buffer.base_utterance, self.buffer.base_seconds
                todo = self.buffer.everything()
                self.replayed += 1
                self._on_status(f"new session {first.session_id}: replaying "
                                f"{self.buffer.total_bytes - self.buffer.base_bytes} bytes")
            self._ws = ws
            self._resender = asyncio.create_task(self._resend(ws, todo))
            return

    async def _resend(self, ws: ClientConnection, todo: list[bytes | None]) -> None:
        """Send `todo` (and `stop` if it was sent), then let new messages through."""
        try:
            for item in todo:
                await ws.send(item if item is not None else encode_client_message(Finalize()))
            if self._stopped:
                await ws.send(encode_client_message(Stop()))
        except ConnectionClosed:
            pass  # `results` notices and reconnects again
        finally:
            self._lock.release()

    async def _wait_retry(self, exc: Exception, backoff: Backoff, failures: int) -> None:
        """Sleep before the next attempt, or re-raise `exc` when retrying cannot help or the
        attempts are used up."""
        delay = retry_delay(exc, backoff)
        if delay is None or (self.attempts is not None and failures > self.attempts):
            raise exc
        self._on_status(f"{explain(self.url, exc)}; reconnecting in {delay:.1f} s")
        await asyncio.sleep(delay)

    async def _open(self, start: Start, url: str | None = None) -> tuple[ClientConnection, Ready | Resumed]:
        """Connect, send `start`, read the first answer (the seq of a `resumed` is kept); a
        server that does not answer within `open_timeout` (not a streamd daemon, or one that hangs)
        is a StreamError, not a wait without end."""
        endpoint = url or self.url
        ws = await handshake(endpoint, self.cafile, self.open_timeout, self.token)
        try:
            await ws.send(encode_client_message(start))
            async with asyncio.timeout(self.open_timeout):
                reply = await ws.recv()
            seq, first = _parse(str(reply))
        except ConnectionClosed:
            raise ConnectionLost(ws.close_code) from None
        except TimeoutError:
            ws.transport.abort()  # a closing handshake would wait on the same silence
            raise StreamError("no_answer", f"the server took the connection but did not answer `start` in "
                                           f"{self.open_timeout:g} s: is it a streamd daemon, and is it serving?") from None
        except ProtocolViolation as e:
            await ws.close()
            raise StreamError("bad_reply", f"{endpoint} does not speak protocol v1: {e}") from None
        if isinstance(first, Error):
            await ws.close()
            raise StreamError(first.code, first.message)
        if not isinstance(first, (Ready, Resumed)):
            await ws.close()
            raise StreamError("bad_reply", f"expected ready, got {first.type}")
        if isinstance(first, Resumed):
            self._last_seq = seq
        return ws, first


def _parse(text: str) -> tuple[int, Ready | Resumed | Partial | Final | Error | Summary]:
    """A server message and its seq."""
    message = parse_server_message(text)
    try:
        seq = int(json.loads(text)["seq"])
    except (KeyError, TypeError, ValueError):
        raise ProtocolViolation("a server message without seq") from None
    return seq, message
