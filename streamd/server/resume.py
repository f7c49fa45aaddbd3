"""Sessions that survive a dropped connection (same daemon).

Every native stream has a session id, chosen when its handshake is answered (and sent in the
`X-Streamd-Session` response header, so that a load balancer can route a resume back here).
While the stream lives, :class:`ResumeState` keeps what a reconnecting client needs: the
messages sent (a ring of `RING` messages, with their `seq`), the audio bytes and `finalize`
messages received. It is plain data, without a socket.

The session id routes (it travels in URLs and headers); what resumes a session is its *resume
secret*, sent to the client in `ready` only (never logged, never in a URL) and compared in
constant time. Logs name a session by :func:`log_name`, a digest of its id.

When the connection drops, the stream is *parked*: decoding goes on, its results go to the ring
only, and :meth:`Sessions.wait_resume` waits up to `grace_s` for a client that sends
`start` with `resume: {session_id, secret, last_seq}`. A resume without the right secret is
treated as a session that is not here (a new one; the owner's stream goes on untouched). A
resume with it while the old connection still looks alive takes over: the old connection is
closed with `TAKEN_OVER_CLOSE`, never silently. That connection is handed to the parked stream,
which replays the messages after `last_seq` and reads on. No client within the grace period:
the stream ends as if the client had gone. A parked stream keeps its slot, but a new stream that
finds the daemon full takes the slot of the one parked longest (:meth:`Sessions.evict`), in
whichever front-end process it is (`StreamContext.make_room`).

:class:`Parking` is one stream's side of all this, beside its connection (`server/handler.py`;
the native face, `server/native.py`, enables it): it parks the stream, hands it a resuming
connection with the replay, and closes a connection taken over or handed off.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import secrets
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from streamd import protocol as p

if TYPE_CHECKING:
    from streamd.server.context import StreamContext

log = logging.getLogger("streamd.server")
SESSION_HEADER = "X-Streamd-Session"
RING = 4096  # messages kept per session for a replay
RING_BYTES = 1 << 20  # and at most this much text: the oldest go first

_session_ids: weakref.WeakKeyDictionary[ServerConnection, str] = weakref.WeakKeyDictionary()


def assign_session_id(conn: ServerConnection) -> str:
    """A new unguessable session id for the connection being handshaken (64 random bits)."""
    session_id = secrets.token_hex(8)
    _session_ids[conn] = session_id
    return session_id


def session_id_of(conn: ServerConnection) -> str:
    """The id assigned at the handshake (a fresh one for connections made without it)."""
    return _session_ids.get(conn) or assign_session_id(conn)


def log_name(session_id: str) -> str:
    """How logs name a session: a digest of its id, so that logs hold neither ids nor secrets."""
    return "s-" + hashlib.sha256(session_id.encode()).hexdigest()[:12]


@dataclass
class ResumeState:
    """What resuming a session needs: plain data, no socket. `secret`: what a resume must show."""

    session_id: str
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    audio_bytes: int = 0  # audio bytes received from the client, over all its connections
    finalizes: int = 0  # `finalize` messages received
    sent: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=RING))
    sent_chars: int = 0  # of the messages in `sent`

    def record(self, seq: int, text: str) -> None:
        """Keep a message sent (or meant to be sent) to the client: the last `RING` of them, and
        no more than `RING_BYTES` of text (about: characters are counted)."""
        if len(self.sent) == RING:
            self.sent_chars -= len(self.sent[0][1])
        self.sent.append((seq, text))
        self.sent_chars += len(text)
        while self.sent_chars > RING_BYTES and len(self.sent) > 1:
            self.sent_chars -= len(self.sent.popleft()[1])

    def after(self, last_seq: int) -> list[str] | None:
        """The messages after `last_seq`, or None when some of them are no longer kept (or
        `last_seq` was never sent)."""
        if not self.sent:
            return None
        first, last = self.sent[0][0], self.sent[-1][0]
        if not first - 1 <= last_seq <= last:
            return None
        return [text for seq, text in self.sent if seq > last_seq]


@dataclass(eq=False)
class Attach:
    """A new connection handed to a parked session; `done` is set when the session lets go of it."""

    session_id: str
    ws: ServerConnection
    last_seq: int
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    used: bool = False  # the session took this connection
    superseded: bool = False  # a newer resume came before the session took it

    def release(self, superseded: bool = False) -> None:
        if not self.done.done():
            self.superseded = superseded
            self.done.set_result(None)


@dataclass(eq=False)
class _Entry:
    state: ResumeState
    drop: Callable[[], None]  # close the session's current connection (TAKEN_OVER_CLOSE)
    handoff: Callable[[], None]  # close it with the handoff code, not to be resumed here
    waiting: asyncio.Future[None] | None = None
    pending: Attach | None = None
    parked_at: float = 0.0


class Sessions:
    """The resumable sessions of this daemon, by id."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._entries: dict[str, _Entry] = {}
        self._evicted: set[str] = set()  # sessions evicted whose connection has not ended yet
        self.on_change: Callable[[], None] = lambda: None  # parked or evicted sessions changed

    @property
    def parked(self) -> int:
        """Sessions whose connection is gone, waiting for their client."""
        return sum(1 for e in self._entries.values() if e.waiting is not None)

    @property
    def reclaimable(self) -> int:
        """Streams whose slot a new stream may take: parked, or evicted and ending now."""
        return self.parked + len(self._evicted)

    @property
    def parked_since(self) -> float:
        """When the session parked longest was parked (`time.monotonic`); inf if none is."""
        return min((e.parked_at for e in self._entries.values() if e.waiting is not None), default=math.inf)

    @property
    def evicted(self) -> int:
        """Sessions evicted for a new stream whose connection has not ended yet."""
        return len(self._evicted)

    def add(self, state: ResumeState, drop: Callable[[], None], handoff: Callable[[], None]) -> None:
        self._entries[state.session_id] = _Entry(state, drop, handoff)

    def remove(self, session_id: str) -> None:
        """The session's connection ended."""
        if session_id in self._evicted:
            self._evicted.discard(session_id)
            self.on_change()
        entry = self._entries.pop(session_id, None)
        if entry is not None and entry.pending is not None:
            entry.pending.release()

    def resume(self, session_id: str, secret: str, ws: ServerConnection,
               last_seq: int) -> tuple[Attach | None, Literal["resumed", "fresh", "refused"]]:
        """Hand `ws` to session `session_id` if `secret` is its resume secret. None (and why) if
        there is no such session here (`fresh`), the secret is wrong or missing (`refused`: the
        session is not touched), or the messages after `last_seq` are no longer kept (`fresh`:
        the session is then ended, its client starts over)."""
        entry = self._entries.get(session_id)
        if entry is None:
            return None, "fresh"
        if not hmac.compare_digest(secret.encode(), entry.state.secret.encode()):
            return None, "refused"
        if entry.state.after(last_seq) is None:  # the client will start over: end the session
            self._forget(entry)
            entry.drop()
            return None, "fresh"
        attach = Attach(session_id, ws, last_seq)
        if entry.pending is not None:  # a second reconnect before the first was taken: the newer wins
            entry.pending.release(superseded=True)
        entry.pending = attach
        if entry.waiting is not None and not entry.waiting.done():
            entry.waiting.set_result(None)  # wake the parked session: it takes `pending`
        else:
            entry.drop()  # the old connection is dead but not noticed yet, or its owner moved
        return attach, "resumed"

    async def wait_resume(self, session_id: str, shutdown: asyncio.Event) -> Attach | None:
        """Park session `session_id` until a client resumes it; None after `grace_s`, on
        shutdown, or if the session cannot be resumed."""
        entry = self._entries.get(session_id)
        if entry is None:
            return None
        if entry.pending is None:
            waiting: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            entry.waiting, entry.parked_at = waiting, time.monotonic()
            self.on_change()
            stop: asyncio.Future[Any] = asyncio.ensure_future(shutdown.wait())
            try:
                await asyncio.wait({waiting, stop}, timeout=self.grace_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                entry.waiting = None
                self.on_change()
        attach, entry.pending = entry.pending, None
        return attach

    def evict(self) -> bool:
        """End the session parked longest (its client has not come back) to make room for a new
        stream; False if none is parked."""
        parked = [e for e in self._entries.values() if e.waiting is not None and not e.waiting.done()]
        if not parked:
            return False
        oldest = min(parked, key=lambda e: e.parked_at)
        self._evicted.add(oldest.state.session_id)  # its slot counts as free until it has ended
        self._forget(oldest)
        self.on_change()
        return True

    def handoff(self) -> int:
        """End every session's connection with the handoff code; returns how many."""
        entries = list(self._entries.values())
        for entry in entries:
            self._end(entry)
        return len(entries)

    def _end(self, entry: _Entry) -> None:
        """The session is not to be resumed here: it ends when its connection does."""
        self._forget(entry)
        entry.handoff()

    def _forget(self, entry: _Entry) -> None:
        """No resume of this session from now on; a parked one ends."""
        self._entries.pop(entry.state.session_id, None)
        if entry.waiting is not None and not entry.waiting.done():
            entry.waiting.set_result(None)


class Carrier(Protocol):
    """What parking needs of the connection that carries a stream (`handler.Connection`); a
    resume replaces its `ws`."""

    ws: ServerConnection
    log_id: str
    state: StreamContext
    send_lock: asyncio.Lock

    async def send_text(self, text: str) -> None: ...

    async def close(self, code: int, reason: str = "") -> None: ...


class Parking:
    """One native stream's resume (the module doc): what it sent (`state`), whether it is
    resumable (`enabled`, from its `ready` on), and the parking, taking over and handing off of
    its connection (`conn`)."""

    def __init__(self, conn: Carrier, session_id: str) -> None:
        self.conn = conn
        self.state = ResumeState(session_id)
        self.enabled = False
        self.handed_off = False
        self._attached: Attach | None = None  # the connection a resume handed over, if any
        self._handoff_task: asyncio.Task[None] | None = None

    @property
    def session_id(self) -> str:
        return self.state.session_id

    def register(self) -> None:
        """The stream is resumable from now on (its `ready` carries the secret)."""
        self.conn.state.sessions.add(self.state, self.drop, self.handoff)

    def end(self) -> None:
        """The stream's connection ended: no resume from now on; a carried connection is let go."""
        if self.enabled:
            self.conn.state.sessions.remove(self.session_id)
        if self._attached is not None:
            self._attached.release()

    async def reattach(self) -> bool:
        """The connection dropped: park the stream until its client resumes it (True: the
        resuming connection carries it now, the messages after its `last_seq` replayed), or give
        up after the grace period, on shutdown, drain or handoff (False)."""
        conn, state = self.conn, self.conn.state
        while self.enabled and not (self.handed_off or state.draining or state.shutdown.is_set()):
            if self._attached is not None:
                self._attached.release()
                self._attached = None
            log_id = conn.log_id
            log.info("connection %s parked (%d s grace)", log_id, state.sessions.grace_s)
            attach = await state.sessions.wait_resume(self.session_id, state.shutdown)
            if attach is None:
                return False
            async with conn.send_lock:
                replay = self.state.after(attach.last_seq)
                if replay is None:
                    attach.release()
                    return False
                conn.ws, self._attached = attach.ws, attach
                attach.used = True
                resumed = p.Resumed(self.session_id, self.state.audio_bytes, self.state.finalizes)
                try:
                    await conn.send_text(p.encode_message(resumed, attach.last_seq))
                    for text in replay:
                        await conn.send_text(text)
                except ConnectionClosed:
                    continue  # the new connection is gone too: park again
            log.info("connection %s resumed after seq %d (%d messages replayed)", log_id, attach.last_seq, len(replay))
            return True
        return False

    def drop(self) -> None:
        """Close the current connection: a resume with the session's secret came while it still
        looked alive. Its client is told (TAKEN_OVER_CLOSE); a dead peer is cut after 1 s."""
        asyncio.ensure_future(_close_taken_over(self.conn.ws))

    def handoff(self) -> None:
        """End this stream's connection with the handoff close code; it is not parked."""
        self.handed_off = True
        if self._handoff_task is None:
            self.conn.state.metrics.resumes.labels(result="handoff").inc()
            self._handoff_task = asyncio.ensure_future(self.conn.close(p.HANDOFF_CLOSE, "handoff: resume elsewhere"))


async def carry(conn: Carrier, attach: Attach) -> str:
    """`conn` resumed a parked session, which now uses its websocket: wait until the session lets
    go of it, then close it if the session did not (returns why, for the log)."""
    log.info("connection %s resumes session %s", conn.log_id, log_name(attach.session_id))
    await attach.done
    if attach.superseded:  # a newer resume of the session came first: never closed silently
        await conn.close(p.TAKEN_OVER_CLOSE, "session resumed on another connection")
    elif not attach.used:  # the session ended before it took this connection
        await conn.close(p.CloseCode.GOING_AWAY, "session ended; resume elsewhere")
    return "resumed " + log_name(attach.session_id)


async def _close_taken_over(ws: ServerConnection) -> None:
    try:
        async with asyncio.timeout(1.0):
            await ws.close(p.TAKEN_OVER_CLOSE, "session resumed on another connection")
    except TimeoutError:
        pass
    finally:
        ws.transport.abort()
