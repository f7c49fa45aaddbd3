"""One websocket connection: the I/O around a `StreamSession` (`streamd.session.core`), whatever
protocol it speaks.

`Connection` owns the socket, timeouts, engine streams and back-pressure, and pumps: client
audio into the session and its engine commands to the engine; engine results into the session
and, through the sender task, out to the client. What is said on the wire is its `Face`'s: the
native protocol (`server/native.py`), OpenAI Realtime (`server/realtime.py`) or Deepgram live
(`server/deepgram.py`). A face has a connection and drives it: it serves the stream
(`Face.serve`, reading with `next_message`, feeding with `feed`, inside `serving`), maps each
result to its messages (`Face.deliver`) and reports the error that ends the stream
(`Face.report`); `Connection.run` does the rest, once for every face.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK
from websockets.protocol import State

from streamd.engine.types import EngineSession
from streamd.errors import (BacklogExceeded, CapacityError, IdleTimeout, InternalError, Overloaded, SessionExpired,
                            SlowConsumer, StreamdError, StreamFailed)
from streamd import protocol as p
from streamd.server.context import StreamContext
from streamd.server.deadline import ReceiveDeadline
from streamd.server.resume import Parking, log_name, session_id_of
from streamd.session.core import End, Open, Result, Segment, StreamSession

log = logging.getLogger("streamd.server")
access_log = logging.getLogger("streamd.access")  # a line per connection as it ends (`log.access`)
# Audio bytes fed to a session at a time: a paced stream's backlog passes max_backlog_s by at most
# this much (1 s of 16 kHz s16le; 4 s of 8 kHz G.711), not by a whole message.
FEED_BYTES = 32 << 10


class Face(Protocol):
    """A connection's protocol: what the client and the server say to each other. It has its
    `Connection` (made by `FaceType`), which does the I/O."""

    async def serve(self) -> str:
        """The stream, from the first message to the close; returns why it ended (for the log).
        Raises what ends it otherwise (`Connection.run` closes the connection then)."""
        ...

    async def deliver(self, result: Result) -> None:
        """Send a result of the session as this protocol's messages."""
        ...

    async def delivered(self) -> None:
        """The results of one engine hand-over (none, maybe) are all delivered."""
        ...

    async def report(self, error: StreamdError) -> None:
        """Tell the client the error that ends the stream (the close frame follows)."""
        ...


FaceType = Callable[["Connection"], Face]


@dataclass(eq=False)
class SegmentStream:
    """A segment's engine stream."""

    segment: Segment
    engine: EngineSession
    flushed: asyncio.Event = field(default_factory=asyncio.Event)  # all results in: its slot is free


def can_send_at_once(ws: ServerConnection, text: str) -> bool:
    """Whether `ws.send(text)` cannot wait: the connection is open and its write buffer, with the
    frame in it, stays under the transport's high-water mark (websockets' send waits only while
    the transport is paused by a full buffer, or for a closing connection). An `asyncio.timeout`
    around every send armed and cancelled a loop timer each message (~10 us of a front end's CPU)."""
    if ws.state is not State.OPEN:
        return False
    transport = ws.transport
    _, high = transport.get_write_buffer_limits()
    return transport.get_write_buffer_size() + 4 * len(text) + 14 < high  # UTF-8: at most 4 bytes a character


class Connection:
    """One websocket and its stream's session, served by the face `face_type` makes."""

    def __init__(self, ws: ServerConnection, state: StreamContext, face_type: FaceType) -> None:
        self.ws, self.state = ws, state
        self.session = StreamSession(state.geometry, state.tokenizer, state.config.endpointing,
                                     state.metrics.count_endpoint, state.config.gate,
                                     utterance_limit_ms=round(state.config.server.utterance_limit_s * 1000),
                                     gate_batch=state.gates)
        self.id = session_id_of(ws)
        self.log_id = log_name(self.id)  # logs never hold the session id (nor its resume secret)
        # Resume (streamd.server.resume): a face that enables it records what it sends; a dropped
        # connection then parks the stream for a client that resumes it (the native face does).
        self.parking = Parking(self, self.id)
        self.send_lock = asyncio.Lock()
        self.engine_streams: dict[Segment, SegmentStream] = {}  # every segment's engine stream, closed at the end
        self.opened: asyncio.Queue[SegmentStream | None] = asyncio.Queue()  # to the sender, in order; None: no more
        self.sender: asyncio.Task[None] | None = None  # the engine's results to the client (`start_sender`)
        # At least 3 chunks: the first result needs a chunk plus the lookahead, so a smaller limit
        # would hold a paced client back before anything could be decoded.
        self.backlog_limit_s = max(state.config.server.max_backlog_s,
                                   3 * state.chunk_ms / 1000)
        self._progress = asyncio.Event()  # set whenever the session's `decoded_s` moves
        self.started = time.monotonic()
        self._receive = ReceiveDeadline()  # each receive's idle deadline; shutdown cuts the one waiting
        self._failed: BaseException | None = None  # why the sender stopped early; ends the receive
        self.face = face_type(self)

    async def run(self) -> None:
        """Serve the connection with its face, and close it on an error (told by the face)."""
        log.debug("connect %s from %s", self.log_id, self.ws.remote_address)
        reason = "error"
        watcher = asyncio.create_task(self._watch_shutdown())
        try:
            reason = await self.face.serve()
        except StreamdError as e:
            reason = e.code
            await self.fail(e)
        except ConnectionClosed as e:
            reason = ("handed off" if self.parking.handed_off else "client closed" if isinstance(e, ConnectionClosedOK)
                      else "client gone")
        except Exception as e:  # a bug: report it to this client only
            log.exception("connection %s failed", self.log_id)
            await self.fail(InternalError(f"internal error: {type(e).__name__}"))
        finally:
            watcher.cancel()
            self._receive.close()
            self.parking.end()
            self._log_access(reason)

    def _log_access(self, reason: str) -> None:
        """The access line: why the connection ended, how much audio and how long, from where (the
        path without its query: a ?token= is never logged). Nothing is built with `log.access` off."""
        if not access_log.isEnabledFor(logging.INFO):
            return
        host, port = (self.ws.remote_address or ("?", 0))[:2]
        remote = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
        access_log.info("disconnect %s (%s) after %.1f s of audio in %.1f s", self.log_id, reason,
                        self.session.received_s, time.monotonic() - self.started,
                        extra={"path": self.ws.request.path.partition("?")[0] if self.ws.request else "?",
                               "remote": remote})

    async def _watch_shutdown(self) -> None:
        """On shutdown, end the receive that is waiting now (it returns None)."""
        await self.state.shutdown.wait()
        self._receive.cut()

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Around a face's stream: however it ends, the sender stops and every segment's engine
        stream is closed."""
        try:
            yield
        finally:
            if self.sender is not None:
                self.sender.cancel()
            for segment_stream in self.engine_streams.values():
                self.state.engine.close(segment_stream.engine)

    def start_sender(self) -> asyncio.Task[None]:
        """Start the sender task: the engine's results, segment after segment, through the session
        to the face (`Face.deliver`). One that fails ends the receive waiting then."""
        self.sender = asyncio.create_task(self._send_results())
        self.sender.add_done_callback(self._sender_done)
        return self.sender

    async def next_message(self) -> str | bytes | None:
        """The client's next message (within `idle_timeout_s`); None once the server shuts down.
        Raises SessionExpired for a message after `max_session_s`."""
        cfg = self.state.config.server
        data = await self.recv(cfg.idle_timeout_s)
        if data is not None and time.monotonic() - self.started > cfg.max_session_s:
            raise SessionExpired(f"session longer than max_session_s={cfg.max_session_s:g}")
        return data

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        """A sender that failed ends the receive waiting now (the receive raises its error)."""
        if task.cancelled() or task.exception() is None:
            return
        self._failed = task.exception()
        self._receive.cut()

    async def run_commands(self) -> None:
        """Run the engine commands the session queued, in order."""
        for command in self.session.commands():
            if isinstance(command, Open):
                await self._open_segment(command.segment, command.after)
                continue
            engine = self.engine_streams[command.segment].engine
            if isinstance(command, End):
                self.state.engine.end(engine)
                if command.last:
                    await self.opened.put(None)
            else:
                self.state.metrics.audio_seconds.inc(command.samples.size / self.session.rate)
                self.state.engine.push(engine, command.samples)

    async def _open_segment(self, segment: Segment, after: Segment | None) -> None:
        """An engine stream for `segment`. After `finalize` (`after`: the segment it ended) a full
        engine waits for that segment's slot: the stream never needs two. A new stream (admitted
        at the handshake, so a slot is being freed: a parked stream's, which is evicted (in any
        front end), an evicted one's, or the second slot of another stream's finalize in flight)
        waits for one up to `idle_timeout_s`."""
        deadline, pause = time.monotonic() + self.state.config.server.idle_timeout_s, 0.01
        while True:
            try:
                engine = await self.state.engine.open()
                break
            except CapacityError as e:
                if after is not None:
                    try:
                        await asyncio.wait_for(self.engine_streams[after].flushed.wait(),
                                               self.state.config.server.idle_timeout_s)
                        return await self._open_segment(segment, None)
                    except TimeoutError:
                        pass
                elif time.monotonic() < deadline:
                    self.state.make_room(self.state.streams() - 1)  # this stream is one of them
                    await asyncio.sleep(pause)
                    pause = min(2 * pause, 0.2)
                    continue
                self.state.metrics.rejections.labels(reason="overloaded").inc()
                raise Overloaded(str(e)) from None
        segment_stream = SegmentStream(segment, engine)
        self.engine_streams[segment] = segment_stream
        await self.opened.put(segment_stream)

    async def feed(self, audio: bytes, convert: Callable[[bytes], bytes] | None = None) -> bool:
        """Feed a message's audio to the session `FEED_BYTES` at a time (`convert`ed first), and
        hold the backlog (`_hold_backlog`) whenever it passes its limit: it never passes it by more
        than one piece, and a paced stream holds the rest of the message as it came, not as
        float32. After shutdown began the rest is fed unpaced; returns False then. The sender
        must have started."""
        assert self.sender is not None
        paced = True
        for i in range(0, len(audio), FEED_BYTES):
            piece = audio[i:i + FEED_BYTES]
            self.session.feed(convert(piece) if convert is not None else piece)
            del piece
            await self.run_commands()
            if paced and self.session.backlog_s > self.backlog_limit_s:
                paced = await self._hold_backlog(self.sender)
        return paced

    async def _hold_backlog(self, sender: asyncio.Task[None]) -> bool:
        """The stream is more than `max_backlog_s` ahead of decoding. Policy `close`: raise
        BacklogExceeded. Policy `pace`: read nothing more from this client until decoding has
        caught up (TCP flow control then holds the client back; nothing is lost). Returns False
        if the server began shutting down meanwhile."""
        cfg = self.state.config.server
        if cfg.backlog_policy == "close":
            self.state.metrics.backlog.labels(action="closed").inc()
            raise BacklogExceeded(f"audio more than max_backlog_s={cfg.max_backlog_s:g} s ahead of decoding")
        self.state.metrics.backlog.labels(action="paced").inc()
        shutdown = asyncio.ensure_future(self.state.shutdown.wait())
        try:
            while self.session.backlog_s > self.backlog_limit_s and not sender.done() and not shutdown.done():
                self._progress.clear()
                progress = asyncio.ensure_future(self._progress.wait())
                await asyncio.wait({progress, sender, shutdown}, return_when=asyncio.FIRST_COMPLETED)
                progress.cancel()
            if sender.done():
                sender.result()  # raises what ended it (the engine failed this stream)
            return not shutdown.done()
        finally:
            shutdown.cancel()

    async def recv(self, timeout: float) -> str | bytes | None:
        """The next client message; None once the server shuts down. A resumable stream whose
        connection drops waits for its client to resume it first."""
        while True:
            try:
                return await self._recv_one(timeout)
            except ConnectionClosed:
                if not await self.parking.reattach():
                    raise

    async def _recv_one(self, timeout: float) -> str | bytes | None:
        """The next client message; None once the server shuts down.

        No timer of its own (`ReceiveDeadline`): this runs for every audio frame.

        Raises:
            IdleTimeout: nothing arrived for `timeout` seconds.
            SessionExpired: the session reached `max_session_s` first.
        """
        max_session_s = self.state.config.server.max_session_s
        left = max_session_s - (time.monotonic() - self.started)
        if self._failed is not None:
            raise self._failed
        if self.state.shutdown.is_set():
            return None
        try:
            deadline = asyncio.get_running_loop().time() + max(0.0, min(timeout, left))
            return await self._receive.receive(self.ws.recv, deadline)
        except TimeoutError:
            if self._failed is not None:
                raise self._failed from None
            if self.state.shutdown.is_set():
                return None
            if left <= timeout:
                raise SessionExpired(f"session longer than max_session_s={max_session_s:g}") from None
            raise IdleTimeout(f"no message for {timeout:g} s") from None

    async def _send_results(self) -> None:
        """The sender: the engine's results, segment after segment, through the session to the face."""
        while (segment_stream := await self.opened.get()) is not None:
            while (item := await segment_stream.engine.results.get()) is not None:
                if isinstance(item, StreamFailed):
                    raise InternalError(str(item))
                results = self.session.receive_result(segment_stream.segment, item)
                self._progress.set()
                await self.deliver_all(results)
            segment_stream.flushed.set()
            await self.deliver_all(self.session.segment_flushed(segment_stream.segment))

    async def deliver_all(self, results: list[Result]) -> None:
        """Deliver one engine hand-over's results through the face, timing each."""
        for result in results:
            # Latency in audio time: received but not reflected in the result when it is sent.
            lag = max(0.0, self.session.received_s - result.audio_processed)
            await self.face.deliver(result)
            metrics = self.state.metrics
            (metrics.final_latency if isinstance(result, p.Final) else metrics.partial_latency).observe(lag)
        await self.face.delivered()

    async def send_text(self, text: str) -> None:
        """Send one message; a client that has not taken it within send_timeout_s is too slow.

        The websocket's write buffer (and the socket's) bound what waits for a slow client."""
        if can_send_at_once(self.ws, text):  # no timer for a send that cannot wait (most)
            await self.ws.send(text)
            return
        timeout = self.state.config.server.send_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await self.ws.send(text)
        except TimeoutError:
            raise SlowConsumer(f"results not read for {timeout:g} s (send_timeout_s)") from None

    async def close(self, code: int, reason: str = "", discard: bool = False) -> None:
        """The closing handshake, or a dropped connection if it takes longer than send_timeout_s.
        `discard` (only once nothing else receives: after an error): what the client sent meanwhile
        is read and dropped; with the socket's reading paused on a full receive queue
        (RECEIVE_QUEUE), the client's close frame would wait behind it until websockets' close
        timeout (a client that sent audio after a bad `start` saw its 1003 after 10 s)."""
        dropping = asyncio.create_task(self._discard_incoming()) if discard else None
        try:
            async with asyncio.timeout(self.state.config.server.send_timeout_s):
                await self.ws.close(code, reason)
        except TimeoutError:
            self.ws.transport.abort()
        finally:
            if dropping is not None:
                dropping.cancel()

    async def _discard_incoming(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await self.ws.recv()

    async def fail(self, exc: StreamdError) -> None:
        """End the stream for `exc`: the face tells the client, then the close frame with its code."""
        code, reason = p.close_for(exc)
        log.info("connection %s: %s: %s", self.log_id, exc.code, exc.message)
        try:
            # A slow consumer is not reading: its close frame (with the reason) is all it may still see.
            if not isinstance(exc, SlowConsumer):
                await self.face.report(exc)
            await self.close(code, reason, discard=True)
        except (ConnectionClosed, SlowConsumer):
            self.ws.transport.abort()
