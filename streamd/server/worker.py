"""A front-end process: the stream port's event loop (websockets, protocol, sessions) with the
engine in the daemon's main process, reached through a channel (`server/frontends.py`).

`RemoteEngine` stands in for the `Engine`: `Connection` cannot tell them apart. A stream's audio
is held here until it completes the engine's next chunk (`ChunkGate`), then goes as one piece
(through shared memory: `server/audio_pipe.py`);
commands of a few milliseconds (`COALESCE_S`) go to the engine in one message; results come back
one message per engine hand-over. The event loop reads and writes the channel itself, without
blocking (`NonBlockingEnd`): threads doing it beside a busy loop wait for the GIL at every system
call (the convoy effect: benchmarks/cpu-2026-12-07l-convoy, messages seconds late at a loop's full load).
"""
from __future__ import annotations

import asyncio
import logging
import os
import select
import signal
import time
from collections.abc import Callable

import numpy as np

from streamd import log as logsetup
from streamd.config import Config
from streamd.errors import CapacityError, StreamFailed
from streamd.engine.types import ChunkGeometry, EngineSession, EngineStatus
from streamd.model.tokenizer import Tokenizer
from streamd.server.audio_pipe import AudioPipe, runs
from streamd.server.channel import NonBlockingEnd
from streamd.server.front import Front
from streamd.server.link import (CloseStream, Done, EndStream, Evict, Failed, FrontMetrics, Handoff, MetricsRequest,
                                 MetricsText, NeedRoom, Opened, OpenStream, Reconfigure, Results, SharedAudio, Shutdown,
                                 Status, StreamAudio, ToEngine, ToFront, Up, WorkerSpec, listening_socket)
from streamd.server.heap import collect_less_often, freeze_startup_heap
from streamd.server.loop_watch import LoopLoad, watch
from streamd.server.context import StreamContext
from streamd.server.metrics import Metrics
from streamd.server.resume import Sessions

log = logging.getLogger("streamd.server")
METRICS_PUSH_S = 1.0  # how often the connection-side metrics go to the engine's process
METRICS_TEXT_TIMEOUT_S = 2.0  # then /metrics serves the last text the engine's process sent
# Commands of this long leave in one channel message: the engine thread, which reads every
# front end's messages between steps, then handles a few hundred a second, not one per turn of
# each event loop (thousands at a thousand streams). Small beside a chunk (80 ms or more).
COALESCE_S = 0.004
STOP_FLUSH_S = 5.0  # at exit, the most time to write what the channel has not taken yet


def run(spec: WorkerSpec) -> None:
    """Entry point of a front-end process."""
    logsetup.configure(spec.config.log.level, spec.config.log.format, access=spec.config.log.access)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the main process decides
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the main process reloads and sends the result
    asyncio.run(_serve(spec))


async def _serve(spec: WorkerSpec) -> None:
    engine = RemoteEngine(NonBlockingEnd(spec.sock), spec.audio, spec.status)
    state = StreamContext(spec.config, engine, Tokenizer(spec.tokenizer), Metrics(process=False),
                          spec.model_name, census=spec.census, census_slot=spec.index,
                          sessions=Sessions(spec.config.server.resume_grace_s),
                          evict_elsewhere=lambda: engine.post(NeedRoom()))
    engine.start(state)
    front = Front(state, metrics_text=engine.metrics_text)

    def reconfigure(config: Config) -> None:
        try:
            front.configure(config)
        except (ValueError, OSError) as e:  # the main process read the same files a moment ago
            log.error("front end: reload failed, the running configuration is kept: %s", e)
        else:
            logsetup.set_levels(config.log.level, config.log.access)

    engine.on_config = reconfigure
    sock = listening_socket(spec.config.server.host, spec.port)
    async with front.listen(sock):
        front.ready = True
        freeze_startup_heap()
        collect_less_often()
        engine.post(Up(os.getpid()))
        pusher = asyncio.create_task(_push_metrics(engine, state.metrics))
        watcher = asyncio.create_task(watch(LoopLoad(f"front end {spec.index}", state.metrics), lambda: len(state.live)))
        await state.shutdown.wait()
        await front.drain()
        pusher.cancel()
        watcher.cancel()
    engine.post(FrontMetrics(state.metrics.front_snapshot()))
    engine.stop()


async def _push_metrics(engine: RemoteEngine, metrics: Metrics) -> None:
    while True:
        engine.post(FrontMetrics(metrics.front_snapshot()))
        await asyncio.sleep(METRICS_PUSH_S)


class ChunkGate:
    """One stream's audio held in its front end until it completes the engine's next chunk.

    The engine can do nothing with audio short of a chunk, and every piece it takes costs its
    one thread the same, however small: with 100 ms client messages and 1120 ms chunks, eleven
    pieces a chunk. Held here, it gets one, at the moment the stream becomes ready there
    (`Stream.full_at`: the same thresholds), so no result comes later for it."""

    def __init__(self, geometry: ChunkGeometry) -> None:
        self.geometry = geometry
        self._pieces: list[np.ndarray] = []
        self._samples = 0  # pushed so far
        self._steps = 0  # full chunks whose audio has been let through
        self._next = geometry.samples_for(geometry.frames_after(1))

    def push(self, samples: np.ndarray) -> np.ndarray | None:
        """Hold `samples`; returns the audio to send now (all held so far) once a chunk is complete."""
        self._pieces.append(samples)
        self._samples += samples.size
        if self._samples < self._next:
            return None
        while self._samples >= self._next:
            self._steps += 1
            self._next = self.geometry.samples_for(self.geometry.frames_after(self._steps + 1))
        return self.flush()

    def flush(self) -> np.ndarray | None:
        """Everything held (the stream ends), or None."""
        pieces, self._pieces = self._pieces, []
        if not pieces:
            return None
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


class RemoteEngine:
    """The engine as a front-end process sees it (the `EngineClient` surface)."""

    def __init__(self, channel: NonBlockingEnd, audio: AudioPipe, status: EngineStatus) -> None:
        self.channel, self.audio = channel, audio
        self._status = status
        self._state: StreamContext | None = None
        self.on_config: Callable[[Config], None] | None = None  # a reloaded configuration arrived
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sessions: dict[int, EngineSession] = {}
        self._opening: dict[int, asyncio.Future[str | None]] = {}
        self._texts: dict[int, asyncio.Future[bytes]] = {}
        self._last_text: tuple[float, bytes] | None = None  # (loop time, the latest /metrics text received)
        self._next = 0
        self._pending: list[ToEngine] = []
        self._audio: list[tuple[int, np.ndarray]] = []  # (stream_id, float32 samples) queued since the last message
        self._gates: dict[int, ChunkGate] = {}  # per open stream: audio short of its next chunk
        self._flush_due = False
        self._writing = False  # the loop watches the channel for room to write the rest
        self._gone = False  # the channel closed: the engine's process is gone

    @property
    def status(self) -> EngineStatus:
        return self._status

    def start(self, state: StreamContext) -> None:
        self._state, self._loop = state, asyncio.get_running_loop()
        self._loop.add_reader(self.channel.fileno(), self._on_readable)

    def stop(self) -> None:
        """Send what is queued, waiting at most `STOP_FLUSH_S` for the channel to take it."""
        self._flush()
        assert self._loop is not None
        self._loop.remove_writer(self.channel.fileno())
        self._writing = False
        deadline = time.monotonic() + STOP_FLUSH_S
        while self.channel.wants_write and (left := deadline - time.monotonic()) > 0:
            select.select([], [self.channel.fileno()], [], left)
            self.channel.flush()

    # -- the EngineClient surface (event loop) ---------------------------------------------------
    async def open(self) -> EngineSession:
        """A new stream with a slot in the engine; raises CapacityError when all are taken."""
        assert self._loop is not None
        stream_id, self._next = self._next, self._next + 1
        reply: asyncio.Future[str | None] = self._loop.create_future()
        self._opening[stream_id] = reply
        self.post(OpenStream(stream_id))
        error = await reply  # cancelled: `_opened` closes the slot it gets
        if error is not None:
            raise CapacityError(error)
        session = EngineSession(id=stream_id)
        self._sessions[stream_id] = session
        self._gates[stream_id] = ChunkGate(self._status.geometry)
        return session

    def push(self, session: EngineSession, samples: np.ndarray) -> None:
        gate = self._gates.get(session.id)
        if samples.size and gate is not None and (chunk := gate.push(samples)) is not None:
            self._audio.append((session.id, chunk))
            self._schedule()

    def end(self, session: EngineSession) -> None:
        gate = self._gates.pop(session.id, None)
        if gate is not None and (rest := gate.flush()) is not None:
            self._audio.append((session.id, rest))  # leaves before the end (`_flush`)
        self.post(EndStream(session.id))

    def close(self, session: EngineSession) -> None:
        if not session.closed:
            session.closed = True
            self._sessions.pop(session.id, None)
            self._gates.pop(session.id, None)
            self.post(CloseStream(session.id))

    async def metrics_text(self) -> bytes:
        """The daemon's /metrics (the engine's process adds every front end's). Never fails: if
        the engine's process does not answer within METRICS_TEXT_TIMEOUT_S, the last text it
        sent (or, before any, this front end's own metrics), with a comment saying so."""
        assert self._loop is not None and self._state is not None
        key = self._next
        self._next += 1
        fut: asyncio.Future[bytes] = self._loop.create_future()
        self._texts[key] = fut
        self.post(MetricsRequest(key))
        try:
            text = await asyncio.wait_for(fut, METRICS_TEXT_TIMEOUT_S)
        except TimeoutError:
            log.warning("front end: the engine's process did not answer /metrics within %.0f s; serving %s",
                        METRICS_TEXT_TIMEOUT_S, "its last answer" if self._last_text else "this front end's own")
            if self._last_text is None:
                return (b"# streamd: the engine's process did not answer; this front end's metrics only\n"
                        + self._state.metrics.render())
            at, text = self._last_text
            age = self._loop.time() - at
            return f"# streamd: the engine's process did not answer; its metrics of {age:.1f} s ago\n".encode() + text
        finally:
            self._texts.pop(key, None)
        self._last_text = (self._loop.time(), text)
        return text

    # -- the channel --------------------------------------------------------------------------------
    def post(self, message: ToEngine) -> None:
        """Queue a message; all queued within `COALESCE_S` leave in one channel message."""
        self._pending.append(message)
        self._schedule()

    def _schedule(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            assert self._loop is not None
            self._loop.call_later(COALESCE_S, self._flush)

    def _flush(self) -> None:
        """One channel message: the audio queued, then the other messages in order. Audio first
        keeps the order that matters: no stream sends audio after its `end` or `close`, and none
        before its `open` was answered."""
        self._flush_due = False
        batch = self._pending
        if self._audio:
            batch = [*self._audio_messages(), *batch]
            self._audio = []
        if batch:
            self._pending = []
            if not self._gone:
                self.channel.send(batch)
                self._watch_writes()

    def _audio_messages(self) -> list[SharedAudio | StreamAudio]:
        """The audio queued, in order, in runs of at most a share of the pipe (`audio_pipe.runs`):
        each run's samples put in the pipe, or in its message when the pipe has no room."""
        assert self._state is not None
        out: list[SharedAudio | StreamAudio] = []
        for a, b in runs([piece.size for _, piece in self._audio], self.audio.capacity):
            stream_ids = [stream_id for stream_id, _ in self._audio[a:b]]
            pieces = [piece for _, piece in self._audio[a:b]]
            sizes = [piece.size for piece in pieces]
            put = self.audio.put(pieces)
            out.append(StreamAudio(stream_ids, sizes, np.concatenate(pieces)) if put is None
                       else SharedAudio(stream_ids, sizes, *put))
            self._state.metrics.audio_messages.labels(path="inline" if put is None else "shared").inc()
        return out

    def _watch_writes(self) -> None:
        """Watch the channel for room while part of what was sent waits (the socket was full)."""
        assert self._loop is not None
        if self.channel.wants_write != self._writing:
            self._writing = self.channel.wants_write
            if self._writing:
                self._loop.add_writer(self.channel.fileno(), self._on_writable)
            else:
                self._loop.remove_writer(self.channel.fileno())

    def _on_writable(self) -> None:
        self.channel.flush()
        self._watch_writes()

    def _on_readable(self) -> None:
        """What the engine's process sent, dispatched now; its end of the channel closing: `_lost`."""
        batches, closed = self.channel.read()
        for messages in batches:
            self._dispatch(messages)
        if closed and not self._gone:
            self._gone = True
            assert self._loop is not None
            self._loop.remove_reader(self.channel.fileno())
            self._loop.remove_writer(self.channel.fileno())
            self._lost()

    def _dispatch(self, messages: list[ToFront]) -> None:
        """On the event loop: results to their sessions, replies to their waiters."""
        assert self._state is not None
        for m in messages:
            match m:
                case Results():
                    for stream_id, result in m.items():
                        if (s := self._sessions.get(stream_id)) is not None:
                            s.results.put_nowait(result)
                case Done(stream_id):
                    if (s := self._sessions.get(stream_id)) is not None:
                        s.results.put_nowait(None)
                case Failed(stream_id, message):
                    if (s := self._sessions.get(stream_id)) is not None:
                        s.results.put_nowait(StreamFailed(message))
                case Opened(stream_id, error):
                    self._opened(stream_id, error)
                case Status():
                    self._on_status(m)
                case Handoff():
                    self._state.sessions.handoff()
                case Evict():
                    self._state.sessions.evict()
                case MetricsText(request, text):
                    if (fut := self._texts.get(request)) is not None and not fut.done():
                        fut.set_result(text)
                case Shutdown():
                    self._state.shutdown.set()
                case Reconfigure(config) if self.on_config is not None:
                    self.on_config(config)

    def _opened(self, stream_id: int, error: str | None) -> None:
        reply = self._opening.pop(stream_id, None)
        if reply is not None and not reply.done():
            reply.set_result(error)
        elif error is None:  # its connection went away while it waited: give the slot back
            self.post(CloseStream(stream_id))

    def _on_status(self, status: Status) -> None:
        assert self._state is not None
        self._status = status.engine
        self._state.draining = status.draining
        self._state.published = status.admission

    def _lost(self) -> None:
        """The engine's process is gone: every stream fails, and this process shuts down."""
        assert self._state is not None
        log.error("front end: the engine's process is gone; shutting down")
        for s in self._sessions.values():
            s.results.put_nowait(StreamFailed("the engine's process is gone"))
        self._sessions.clear()
        self._state.shutdown.set()
