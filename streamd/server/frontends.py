"""Front-end processes: `server.workers` websocket event loops sharing the daemon's port
(SO_REUSEPORT), each bridged to the engine in this process by a socket pair (`server/channel.py`).

A front end runs the protocol, sessions and everything per message (`server/worker.py`); this
process keeps only the engine thread, the admin socket and the bridges. A bridge is an `IoSource`
of the engine: the engine thread itself reads the front end's commands (one message names every
stream's audio of a few milliseconds, which the front end put in shared memory:
`server/audio_pipe.py`) and writes the results it delivers to its
streams (one message per engine hand-over), between steps. So the engine's process does no
per-message websocket or JSON work, and no thread of it competes with the steps for the GIL.

Each front end writes its open and parked streams to a `Census` in shared memory, which every
process reads for admission: a new stream takes the slot of the stream parked longest in any
front end (the engine's process routes the eviction, below).

The channel's messages, the spec a front end starts from and the shared port are in
`server/link.py`.
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
import socket
from concurrent.futures import Future
from collections.abc import Callable

import numpy as np

from streamd.config import Config
from streamd.engine.engine import Engine
from streamd.engine.inbox import Close, End, StreamCommand
from streamd.engine.types import EngineSession, Handover
from streamd.server.audio_pipe import AudioPipe
from streamd.server.channel import NonBlockingEnd, socket_pair
from streamd.server.census import Census
from streamd.server.context import ServerState
from streamd.server.link import (CloseStream, Done, EndStream, Evict, Failed, FrontMetrics, Handoff, MetricsRequest,
                                 MetricsText, NeedRoom, Opened, OpenStream, Reconfigure, Results, SharedAudio, Shutdown,
                                 Status, StreamAudio, ToEngine, ToFront, Up, WorkerSpec, reserve_port)
from streamd.server.worker import run

log = logging.getLogger("streamd.server")
START_TIMEOUT_S = 120.0  # a front end imports the server and websockets (no torch) before it listens
STOP_TIMEOUT_S = 5.0
PUBLISH_S = 0.5  # how often a changed status (the admission estimate moves with step times) goes out


class Bridge:
    """The engine's side of one front-end process: its streams' sessions and its channel, served
    on the engine thread (an `IoSource` of the engine)."""

    def __init__(self, index: int, state: ServerState, sock: socket.socket, audio: AudioPipe,
                 process: multiprocessing.process.BaseProcess, loop: asyncio.AbstractEventLoop,
                 on_lost: Callable[[Bridge], None], on_evict: Callable[[], None]) -> None:
        self.index, self.state, self.process = index, state, process
        self.channel = NonBlockingEnd(sock)
        self.audio = audio
        self._loop, self._on_lost, self._on_evict = loop, on_lost, on_evict
        self.sessions: dict[int, EngineSession] = {}
        self.up: Future[int] = Future()
        self.gone = False

    # -- IoSource (engine thread) ----------------------------------------------------------------
    def fileno(self) -> int:
        return self.channel.fileno()

    @property
    def wants_write(self) -> bool:
        return self.channel.wants_write

    def writable(self) -> None:
        self.channel.flush()

    def readable(self) -> None:
        messages, eof = self.channel.read()
        for batch in messages:
            self._apply(batch)
        if eof or self.channel.broken:
            self._lost()

    # -- front end -> engine (engine thread) -----------------------------------------------------
    def _apply(self, messages: list[ToEngine]) -> None:
        engine = self.state.engine
        batch: list[StreamCommand] = []
        for m in messages:
            match m:
                case SharedAudio() | StreamAudio():  # its streams' queued audio: taken now
                    take_audio(engine, m, [self.sessions.get(i) for i in m.stream_ids], self.audio)
                case EndStream(stream_id):
                    if (s := self.sessions.get(stream_id)) is not None:
                        batch.append(End(s))
                case CloseStream(stream_id):
                    if (s := self.sessions.pop(stream_id, None)) is not None:
                        s.closed = True
                        batch.append(Close(s))
                case OpenStream(stream_id):
                    self._open(stream_id)
                case FrontMetrics(families):
                    self.state.metrics.set_remote(self.index, families)
                case MetricsRequest(request):  # rendered on the event loop, not between steps
                    self._loop.call_soon_threadsafe(self._render_metrics, request)
                case NeedRoom():
                    self._on_evict()
                case Up(pid):
                    self.up.set_result(pid)
        if batch:
            engine.post_many(batch)

    def _open(self, stream_id: int) -> None:
        session = EngineSession(sink=self._deliver, id=stream_id)
        self.sessions[stream_id] = session

        def opened(fut: Future[None]) -> None:  # on the engine thread
            err = fut.exception()
            if err is not None:
                self.sessions.pop(stream_id, None)
            if not self.gone:
                self.channel.send([Opened(stream_id, None if err is None else str(err))])

        self.state.engine.open_session(session).add_done_callback(opened)

    def _render_metrics(self, request: int) -> None:
        self.post([MetricsText(request, self.state.metrics.render())])

    def _lost(self) -> None:
        """The front end exited (or its channel broke): its streams' slots are freed."""
        if self.gone:
            return
        self.gone = True
        self.state.engine.remove_source(self)
        self.channel.close()
        gone = list(self.sessions.values())
        self.sessions.clear()
        if gone:
            self.state.engine.post_many([Close(s) for s in gone])
        came_up = self.up.done()
        if not came_up:
            self.up.set_exception(RuntimeError(f"front end {self.index} exited before listening"))
        if came_up:
            self._on_lost(self)

    def close(self) -> None:
        """Close the channel (engine thread, once it is no longer served: at shutdown)."""
        if not self.gone:
            self.gone = True
            self.channel.close()

    # -- engine -> front end ---------------------------------------------------------------------
    def _deliver(self, handover: Handover) -> None:
        """The engine's sink for this front end's sessions (on the engine thread)."""
        messages = front_messages(handover)
        for m in messages:
            if isinstance(m, Done):
                self.sessions.pop(m.stream_id, None)
        if not self.gone:
            self.channel.send(messages)

    def post(self, messages: list[ToFront]) -> None:
        """Send `messages` to the front end (from any thread: the engine thread writes them at
        its next turn, also while a step is in flight: `send`)."""
        self.state.engine.send(self, messages)

    def send(self, messages: list[ToFront]) -> None:
        """Write `messages` to the channel (engine thread)."""
        if not self.gone:
            self.channel.send(messages)


def take_audio(engine: Engine, message: SharedAudio | StreamAudio, sessions: list[EngineSession | None],
               pipe: AudioPipe) -> None:
    """A front end's audio message, on the engine thread: each piece into its stream's ring
    (`Engine.take_pieces`; sessions[i] is stream_ids[i]'s, None if unknown); the samples of a
    `SharedAudio` are then freed in the front end's `pipe`, also when taking them failed."""
    if isinstance(message, StreamAudio):
        engine.take_pieces(sessions, message.sizes, message.samples)
        return
    try:
        engine.take_pieces(sessions, message.sizes, pipe.view(message.at, sum(message.sizes)))
    finally:
        pipe.free(message.end)


def front_messages(handover: Handover) -> list[ToFront]:
    """One engine hand-over for a front end's sessions as channel messages: one `Results` with
    every result, then the `Done` and `Failed` of the streams it finished (a stream's last result
    comes before its end)."""
    out: list[ToFront] = []
    if handover.sessions and handover.results is not None:
        ids = np.fromiter((s.id for s in handover.sessions), np.int64, len(handover.sessions))
        out.append(Results(ids, handover.results))
    out.extend(Done(s.id) if item is None else Failed(s.id, str(item)) for s, item in handover.ended)
    return out


class FrontEnds:
    """Starts, informs and stops the front-end processes of one daemon."""

    def __init__(self, state: ServerState, workers: int) -> None:
        self.state, self.workers = state, workers
        self._ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads or CUDA
        self.census = Census(self._ctx, workers)
        self.bridges: list[Bridge] = []
        self.port = 0
        self._reserved: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._publisher: asyncio.Task[None] | None = None
        self._replacing: set[asyncio.Future[None]] = set()  # front ends being started in place of lost ones
        self._stopping = False

    async def start(self) -> int:
        """Start every front end; returns the port once all listen."""
        cfg = self.state.config.server
        self._loop = asyncio.get_running_loop()
        self._reserved = reserve_port(cfg.host, cfg.port)
        self.port = int(self._reserved.getsockname()[1])
        self.state.census = self.census
        self.state.listeners.append(self.publish)
        self.state.handoff_hooks.append(self.hand_off)
        self.bridges = list(await asyncio.gather(*(self._spawn(i) for i in range(self.workers))))
        pids = await asyncio.wait_for(asyncio.gather(*(asyncio.wrap_future(b.up) for b in self.bridges)),
                                      START_TIMEOUT_S)
        log.info("%d front-end processes listening (pids %s)", self.workers, " ".join(map(str, pids)))
        self._publisher = asyncio.create_task(self._publish_changes())
        return self.port

    async def _spawn(self, index: int) -> Bridge:
        """Start front end `index`. `Process.start` runs in a thread: it writes the spec to the
        child, which reads it only after importing the server (a second or more), so on the event
        loop it would hold up /metrics, the admin socket and everything else meanwhile."""
        cfg = self.state.config
        ours, theirs = socket_pair()
        audio = AudioPipe.create()
        spec = WorkerSpec(index, theirs, cfg, audio, self.state.tokenizer.model_proto, self.state.model_name,
                          self.state.engine.status, self.census, self.port)
        process = self._ctx.Process(target=run, args=(spec,), name=f"streamd-front{index}", daemon=True)
        try:
            await asyncio.to_thread(process.start)
        finally:
            theirs.close()
            audio.close()  # the child has its own descriptor; the mapping stays
        assert self._loop is not None
        bridge = Bridge(index, self.state, ours, audio, process, self._loop, self._lost, self._evict)
        # what changed while it started (a drain, a migration) reaches it after its spec
        bridge.post([self._status()])
        self.state.engine.add_source(bridge)
        return bridge

    def _lost(self, bridge: Bridge) -> None:
        """A front end exited on its own (on its bridge's thread): start another in its place."""
        self.census.set(bridge.index, 0)
        if self._stopping or self._loop is None:
            return
        log.error("front end %d (pid %s) exited unexpectedly; starting another", bridge.index, bridge.process.pid)
        self._loop.call_soon_threadsafe(self._replace, bridge)

    def _evict(self) -> None:
        """A front end's new stream needs a slot (engine thread): the front end holding the
        stream parked longest ends it."""
        index = self.census.parked_longest()
        if index is not None and not (bridge := self.bridges[index]).gone:
            bridge.channel.send([Evict()])

    def _replace(self, bridge: Bridge) -> None:
        if self._stopping or self.bridges[bridge.index] is not bridge:
            return
        task = asyncio.ensure_future(self._respawn(bridge))
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _respawn(self, bridge: Bridge) -> None:
        await asyncio.to_thread(bridge.process.join, 1.0)
        if not self._stopping and self.bridges[bridge.index] is bridge:
            self.bridges[bridge.index] = await self._spawn(bridge.index)

    def _status(self) -> Status:
        return Status(self.state.engine.status, self.state.draining, self.state.admission())

    async def _publish_changes(self) -> None:
        last: Status | None = None
        while True:
            if (now := self._status()) != last:
                self.publish()
                last = now
            await asyncio.sleep(PUBLISH_S)

    def hand_off(self) -> int:
        """Every front end closes its streams with the handoff code; returns how many were open."""
        for b in self.bridges:
            b.post([Handoff()])
        return self.census.total()

    def publish(self) -> None:
        """Send every front end the engine's status (cut-over included) and the draining flag."""
        msg = self._status()
        for b in self.bridges:
            b.post([msg])

    def configure(self, config: Config) -> None:
        """A reloaded configuration reaches every front end (and the ones started later)."""
        for b in self.bridges:
            b.post([Reconfigure(config)])

    async def stop(self) -> None:
        """Shut the front ends down: each drains its streams (drain_timeout_s), then exits."""
        self._stopping = True
        if self._publisher is not None:
            self._publisher.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)  # a front end starting now stops too
        for b in self.bridges:
            b.post([Shutdown()])
        wait_s = self.state.config.server.drain_timeout_s + 2 * self.state.config.server.send_timeout_s
        await asyncio.gather(*(asyncio.to_thread(b.process.join, wait_s) for b in self.bridges))

    async def kill(self) -> None:
        """Whatever is still running after `stop` (or a failed start) is terminated."""
        self._stopping = True
        if self._publisher is not None:
            self._publisher.cancel()
        for b in self.bridges:
            if b.process.is_alive():
                log.warning("front end %d did not exit: terminating it", b.index)
                b.process.terminate()
        await asyncio.gather(*(asyncio.to_thread(b.process.join, 5.0) for b in self.bridges))
        try:
            await asyncio.wait_for(asyncio.wrap_future(self.state.engine.detach(list(self.bridges))), STOP_TIMEOUT_S)
        except TimeoutError:
            log.warning("the engine did not detach the front ends' channels")
        if self._reserved is not None:
            self._reserved.close()
