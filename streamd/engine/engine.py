"""The engine: one dedicated thread runs every model call; the event loop talks to it in typed
commands and reads its `EngineStatus` snapshot. The engine also owns live migration
(`Engine.migrate`: the copy is made off the thread, the swap between two steps).

The event loop never touches tensors. It posts commands (`Open`, `Audio`, `End`, `Close`, `Call`)
to an inbox; the engine thread
drains it, runs a step as soon as streams have a full chunk (waiting at most `batch_wait_s` for
more streams to fill the batch; on a GPU, while a step runs on the device, the next is launched
behind it, so that the host's work for one step overlaps the device's for the other), and posts
each stream's results back to its session's queue
with `call_soon_threadsafe`, or to the session's `sink` (a front-end process's bridge, see
`server/frontends.py`). No polling: the thread sleeps in a selector, woken by a byte on its own
socket pair or by an `IoSource` (a front end's channel, which the engine thread itself reads and
writes between steps: no other thread of the process then competes with steps for the GIL).
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from streamd.engine.migration import (HOT_S, IN_USE_S, MemoryGuard, MigrationFailed, MigrationReport, PreparedSteps,
                                      cut_over, placed_copy, placement, prepare_steps, stage_cache, target_bytes)
from streamd.engine.placement import DTYPE_NAMES
from streamd.engine.recognizer import Launched, Recognizer
from streamd.engine.stream import Stream
from streamd.engine.types import EngineSession, EngineStatus, ResultItem, Sink, StreamFailed
from streamd.model.transducer import Transducer

log = logging.getLogger("streamd.engine")

StepObserver = Callable[[float, int], None]  # (seconds, batch size)
STEP_POLL_S = 0.0005  # while a step runs on the device: how often the engine thread checks it
GAP_WAIT_S = 3.0  # the most a migration waits for the first step after its cut-over (its serving gap)


@dataclass(frozen=True, slots=True)
class Audio:
    """Queue float32 mono samples at the model rate for `session`."""

    session: EngineSession
    samples: np.ndarray


@dataclass(frozen=True, slots=True)
class End:
    """No more audio for `session`: flush what is left."""

    session: EngineSession


@dataclass(frozen=True, slots=True)
class Close:
    """Release `session`'s slot now; its pending audio is dropped."""

    session: EngineSession


@dataclass(frozen=True, slots=True)
class Open:
    """Give `session` a slot; `future` gets None, or the CapacityError when none is free."""

    session: EngineSession
    future: Future[None]


@dataclass(frozen=True, slots=True)
class Call:
    """Run `fn(recognizer)` on the engine thread between two steps; its result goes to `future`."""

    fn: Callable[[Recognizer], Any]
    future: Future[Any]


@dataclass(frozen=True, slots=True)
class Io:
    """Run `fn()` on the engine thread at its next turn, also while a step is in flight (it must
    not touch the recognizer): a front end's bridge sends its messages this way."""

    fn: Callable[[], None]


@dataclass(frozen=True, slots=True)
class Stop:
    """Finish the engine thread (slots released)."""


Command = Open | Audio | End | Close | Call | Io | Stop
StreamCommand = Audio | End | Close  # what a front end's bridge posts in bulk


class IoSource(Protocol):
    """A non-blocking socket the engine thread serves between steps. `readable` and `writable`
    run on the engine thread when the selector says so; `wants_write` asks for `writable`."""

    def fileno(self) -> int: ...

    def readable(self) -> None: ...

    def writable(self) -> None: ...

    @property
    def wants_write(self) -> bool: ...


@dataclass
class StepTimes:
    """Where the engine thread's time went since the last report (logged every `every_s`): each
    step's launch (host work: features, window layout, queuing the GPU work), the wait for the
    device (spent serving the front ends), and the results (read back, delivered)."""

    every_s: float = 10.0
    steps: int = 0
    streams: int = 0
    launch_s: float = 0.0
    device_s: float = 0.0
    results_s: float = 0.0
    since: float = field(default_factory=time.perf_counter)

    def add(self, batch: int, launch_s: float, device_s: float, results_s: float) -> None:
        self.steps += 1
        self.streams += batch
        self.launch_s += launch_s
        self.device_s += device_s
        self.results_s += results_s
        now = time.perf_counter()
        if now - self.since >= self.every_s:
            wall, n = now - self.since, self.steps
            busy = self.launch_s + self.device_s + self.results_s
            log.info("engine: %d steps in %.1f s, mean batch %.0f; per step: launch %.1f ms, on the device "
                     "(serving the front ends) %.1f ms, results %.1f ms; %.0f %% of the time between steps",
                     n, wall, self.streams / n, 1e3 * self.launch_s / n, 1e3 * self.device_s / n,
                     1e3 * self.results_s / n, 100 * max(0.0, 1 - busy / wall))
            self.steps = self.streams = 0
            self.launch_s = self.device_s = self.results_s = 0.0
            self.since = now


@dataclass(frozen=True, slots=True)
class _Step:
    """A launched step: its sessions in order, when its launch began and how long it took."""

    batch: list[EngineSession]
    launched: Launched
    t0: float
    launch_s: float


class Engine:
    """`pipeline`: launch the next step while one runs on the device (None: when the model's
    device runs steps asynchronously, i.e. a GPU; on a CPU a launch computes the whole step, and
    launching another before delivering the first would only delay its results)."""

    def __init__(self, recognizer: Recognizer, max_batch: int, batch_wait_s: float,
                 on_step: StepObserver | None = None, pipeline: bool | None = None) -> None:
        self.recognizer = recognizer
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self.pipeline = pipeline
        self._on_step = on_step
        self._lock = threading.Lock()
        self._inbox: deque[Command] = deque()
        self._sleeping = False  # the engine thread waits in `select` (guarded by `_lock`)
        self._wake_r, self._wake_w = socket.socketpair()
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._sources: dict[IoSource, int] = {}  # source -> the selector events it is registered for
        self._live: dict[EngineSession, None] = {}  # sessions with a slot, oldest first
        # Readiness is tracked, not scanned for: only a session that got audio or ended (or just
        # stepped) is checked again, so the engine thread's work between steps does not grow with
        # the streams that are waiting for audio.
        self._touched: dict[EngineSession, None] = {}
        self._ready_set: dict[EngineSession, None] = {}  # in the order they became ready
        self._outbox: list[tuple[EngineSession, ResultItem]] = []
        self._flight: deque[_Step] = deque()  # launched steps, oldest first (at most two)
        self._held: deque[Command] = deque()  # commands that wait until no step is in flight
        self._landed_at = 0.0  # when the last step's results were delivered (perf_counter)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._cutting_over = False
        self._migrating = asyncio.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._landing: list[Future[float]] = []  # resolved with the time the next step lands
        self._status = self._snapshot()
        self.step_times = StepTimes()

    # -- loop side -----------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="streamd-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._post(Stop())
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    @property
    def status(self) -> EngineStatus:
        """The latest snapshot (made on the engine thread after each step and migration)."""
        return self._status

    def _snapshot(self) -> EngineStatus:
        rec = self.recognizer
        return EngineStatus(str(rec.model.device), DTYPE_NAMES[rec.model.dtype], rec.geometry, rec.capacity,
                            rec.encoder_step.mode, getattr(rec.search, "mode", "eager"), self._cutting_over,
                            rec.eager_reason())

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` on the event loop whenever a migration changes the status."""
        self._listeners.append(listener)

    async def migrate(self, master: Transducer, device: torch.device | None, dtype: torch.dtype | None
                      ) -> MigrationReport:
        """Move serving to a copy of `master` (fp32 CPU weights) at `device` / `dtype` (None: as
        now) while streams go on (see `engine/migration.py`): the copy is made and probed, and
        its CUDA graphs captured, off the engine thread, then swapped in between two steps with
        every live stream's state. On failure the engine keeps serving where it was; the
        report says why. One at a time. When streams had a chunk waiting at the cut-over, returns
        once the first step after it has delivered its results (at most `GAP_WAIT_S` later): the
        report has the serving gap."""
        async with self._migrating:
            rec = self.recognizer
            source = placement(rec.model)
            report = MigrationReport(False, source, source, 0.0, 0.0, rec.active, at=time.time())
            try:
                dev = device if device is not None else rec.model.device
                dt = dtype if dtype is not None else rec.model.dtype
                report.target = f"{dev} {DTYPE_NAMES[dt]}"
                if report.target == source:
                    report.ok, report.moved = True, False
                    return report
                t0 = time.perf_counter()
                guard = MemoryGuard(dev)
                need = target_bytes(master, dt, rec.capacity, rec.att_context, rec.kv_cache)
                await asyncio.to_thread(guard.require, need, "the model and its stream state")
                target = await asyncio.to_thread(placed_copy, master, dev, dt, rec.att_context)
                staged = await asyncio.to_thread(stage_cache, target, rec.capacity, rec.att_context,
                                                rec.kv_cache)
                now = time.monotonic()
                in_use = [rec.graph_sizes(now - HOT_S), rec.graph_sizes(now - IN_USE_S)]
                steps = await asyncio.to_thread(prepare_steps, rec, target, in_use, guard.room)
                report.prepare_ms = (time.perf_counter() - t0) * 1000
                report.recapture_ms, report.graphs = steps.capture_ms, steps.graphs
                report.graphs_deferred = steps.deferred
                self._set_cutting_over(True)
                try:
                    report.pause_ms, report.streams, before, landed, release = await self.call(
                        lambda r: self._cut_over(r, target, staged, steps))
                finally:
                    self._set_cutting_over(False)
                report.ok = True
            except Exception as e:  # noqa: BLE001 - whatever failed, serving goes on where it was
                report.error = str(e) if isinstance(e, (ValueError, MigrationFailed)) else f"{type(e).__name__}: {e}"
                return report
            if landed is not None:
                try:
                    after = await asyncio.wait_for(asyncio.wrap_future(landed), GAP_WAIT_S)
                except TimeoutError:
                    pass  # no step since: nothing to measure
                else:
                    report.serving_gap_ms = (after - before) * 1000
            await asyncio.to_thread(release)
            return report

    def _cut_over(self, rec: Recognizer, target: Transducer, staged: Any, steps: PreparedSteps
                  ) -> tuple[float, int, float, Future[float] | None, Callable[[], None]]:
        """`cut_over` on the engine thread; also when the serving gap began (the last landing,
        at most one chunk before the pause), if streams have a chunk waiting a future of the
        next landing (None: no stream waits for a step), and the source's `release`."""
        paused = time.perf_counter()
        pause_ms, streams, release = cut_over(rec, target, staged, steps)
        if steps.deferred:  # the first steps capture graphs: they need the source's memory
            release()
        landed: Future[float] | None = None
        if self._count_ready():
            landed = Future()
            self._landing.append(landed)
        return pause_ms, streams, max(self._landed_at, paused - rec.geometry.chunk_ms / 1000), landed, release

    def _set_cutting_over(self, on: bool) -> None:
        self._cutting_over = on
        self._status = self._snapshot()
        for listener in self._listeners:
            listener()

    async def open(self) -> EngineSession:
        """A new stream with its own slot; raises CapacityError when all slots are taken."""
        session = EngineSession()
        await asyncio.wrap_future(self.open_session(session))
        return session

    def open_session(self, session: EngineSession) -> Future[None]:
        """Give `session` a slot (from any thread); the future raises CapacityError if none is free."""
        fut: Future[None] = Future()
        self._post(Open(session, fut))
        return fut

    def push(self, session: EngineSession, samples: np.ndarray) -> None:
        """Queue float32 mono samples at the model rate."""
        if samples.size:
            self._post(Audio(session, samples))

    def end(self, session: EngineSession) -> None:
        """No more audio: flush what is left; `results` then ends with None."""
        self._post(End(session))

    def close(self, session: EngineSession) -> None:
        """Release the stream now (client gone); pending audio is dropped."""
        if not session.closed:
            session.closed = True
            self._post(Close(session))

    async def call(self, fn: Callable[[Recognizer], Any]) -> Any:
        """Run fn(recognizer) on the engine thread between two steps; returns its result."""
        return await asyncio.wrap_future(self.submit(fn))

    def run_soon(self, fn: Callable[[], None]) -> None:
        """Run fn() on the engine thread at its next turn, without waiting for steps in flight
        (from any thread; fn must not touch the recognizer)."""
        self._post(Io(fn))

    def submit(self, fn: Callable[[Recognizer], Any]) -> Future[Any]:
        """Run fn(recognizer) on the engine thread between two steps (from any thread)."""
        fut: Future[Any] = Future()
        self._post(Call(fn, fut))
        return fut

    def post_many(self, commands: list[StreamCommand]) -> None:
        """Queue several stream commands at once, in order (from any thread: a front-end bridge
        hands over a batch of its streams' audio this way)."""
        with self._lock:
            self._inbox.extend(commands)
            wake, self._sleeping = self._sleeping, False
        if wake:
            self._wake()

    def _post(self, command: Command) -> None:
        with self._lock:
            self._inbox.append(command)
            wake, self._sleeping = self._sleeping, False
        if wake:
            self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:  # the buffer is full of wake-ups already
            pass

    def add_source(self, source: IoSource) -> None:
        """Serve `source` on the engine thread from its next turn on (from any thread)."""
        self.submit(lambda rec: self._watch(source))

    def remove_source(self, source: IoSource) -> None:
        """Stop serving `source` (on the engine thread; `add_source`'s inverse). Idempotent."""
        if self._sources.pop(source, None) is not None:
            self._selector.unregister(source)

    # -- engine thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _serve(self) -> None:
        while not self._stopping:
            if not self._flight:
                self._drain(block=not self._count_ready())
                if self._stopping or not self._count_ready():
                    continue
                deadline = time.monotonic() + self.batch_wait_s
                target = min(self.max_batch, len(self._live))
                while self._count_ready() < target and (left := deadline - time.monotonic()) > 0:
                    self._drain(block=True, timeout=left)
                if self._count_ready():  # every ready stream may have closed while the batch filled
                    self._launch()
                if self._flight and not self._pipelining():
                    self._land()
            else:
                # A step is on the device: queue the next behind it (its host work overlaps the
                # device's), unless a held call needs the pipeline empty; then land the older.
                if not self._held and self._count_ready():
                    self._launch()
                self._land()
        while self._flight:
            self._land()
        for s in list(self._live):
            self._release(s)

    def _pipelining(self) -> bool:
        if self.pipeline is not None:
            return self.pipeline
        return self.recognizer.model.device.type == "cuda"

    def _drain(self, block: bool, timeout: float | None = None) -> None:
        """Apply what was posted and what the sources have; with `block` and nothing posted,
        first wait (at most `timeout` seconds, None: until something comes)."""
        with self._lock:
            sleep = block and not self._inbox
            self._sleeping = sleep
        self._serve_sources(timeout if sleep else 0)
        if sleep:
            with self._lock:
                self._sleeping = False
        with self._lock:
            items = list(self._inbox)
            self._inbox.clear()
        for command in items:
            self._apply(command)
        self._flush()
        self._update_interest()

    def _serve_sources(self, timeout: float | None) -> None:
        """Wait for the selector (at most `timeout` s) and let the sources read and write."""
        for key, mask in self._selector.select(timeout):
            source: IoSource | None = key.data
            if source is None:
                self._drain_wake_ups()
            elif source in self._sources:  # an earlier event's handler may have removed it
                if mask & selectors.EVENT_WRITE:
                    source.writable()
                if mask & selectors.EVENT_READ:
                    source.readable()

    def _while_stepping(self, launched: Launched) -> None:
        """Until the device has run the launched step: serve the sources and take in audio
        (the engine thread would otherwise sit idle in `collect` for the GPU's share of the
        step). Stream commands are applied now: a slot closed and opened again is reset by the
        next launch, queued on the device behind the steps in flight, and a stream does not
        finish while a step of it is in flight. Calls (migrations, warm-up) and the stop are
        held until no step is in flight (`_land`), in order. Checks the device every
        `STEP_POLL_S` while the sockets are quiet."""
        timeout = 0.0
        while True:
            self._serve_sources(timeout)
            with self._lock:
                items, self._inbox = self._inbox, deque()
            for command in items:
                if isinstance(command, (Call, Stop)):
                    self._held.append(command)
                else:
                    self._apply(command)
            if launched.done():
                return
            timeout = STEP_POLL_S

    def _drain_wake_ups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _watch(self, source: IoSource) -> None:
        self._sources[source] = selectors.EVENT_READ
        self._selector.register(source, selectors.EVENT_READ, source)
        self._update_interest()

    def _update_interest(self) -> None:
        """Ask for `writable` from the sources with queued output, and only from those."""
        for source, events in self._sources.items():
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if source.wants_write else 0)
            if want != events:
                self._sources[source] = want
                self._selector.modify(source, want, source)

    def _apply(self, command: Command) -> None:
        if isinstance(command, Open):
            try:
                self._open(command.session)
            except BaseException as e:  # CapacityError: handed to whoever awaits the open
                command.future.set_exception(e)
            else:
                command.future.set_result(None)
            return
        if isinstance(command, Call):
            try:
                command.future.set_result(command.fn(self.recognizer))
            except BaseException as e:  # handed to the awaiting coroutine
                command.future.set_exception(e)
            return
        if isinstance(command, Io):
            command.fn()
            return
        if isinstance(command, Stop):
            self._stopping = True
            return
        session = command.session
        if session.stream is None:
            return  # a closed or failed stream: late audio is ignored
        if isinstance(command, Audio):
            self.take_audio(session, command.samples)
        elif isinstance(command, End):
            session.stream.end()
            self._touched[session] = None
            self._finish_if_done(session)
        else:
            self._release(session)

    def take_audio(self, session: EngineSession, samples: np.ndarray) -> None:
        """Queue `session`'s float32 samples now: on the engine thread only (a front end's
        bridge, which runs there, hands its streams' audio over this way, not as commands).
        Ignored once the stream has closed or failed."""
        if session.stream is not None and session.stream.push_audio(samples):
            self._ready_set[session] = None

    def _open(self, session: EngineSession) -> None:
        session.stream = self.recognizer.open()
        self._live[session] = None

    def _count_ready(self) -> int:
        """Streams with a step's worth of input (`_ready_set`, brought up to date)."""
        for s in self._touched:
            if s.stream is not None and s.stream.ready:
                self._ready_set[s] = None
        self._touched.clear()
        return len(self._ready_set)

    def _launch(self) -> None:
        """Launch a step of the oldest ready streams (at most `max_batch`)."""
        batch: list[EngineSession] = []
        streams: list[Stream] = []
        for s in itertools.islice(self._ready_set, self.max_batch):
            if s.stream is not None:
                batch.append(s)
                streams.append(s.stream)
        t0 = time.perf_counter()
        try:
            launched = self.recognizer.launch(streams)
        except Exception as e:
            self._fail(batch, e)
            return
        for s in batch:  # ready again only if more input is there
            del self._ready_set[s]
            self._touched[s] = None
            s.in_flight += 1
        self._flight.append(_Step(batch, launched, t0, time.perf_counter() - t0))

    def _land(self) -> None:
        """Wait for the oldest launched step (serving the sources meanwhile) and deliver its
        results; once no step is in flight, the held commands go first in the inbox."""
        step = self._flight.popleft()
        t1 = time.perf_counter()
        try:
            self._while_stepping(step.launched)
            t2 = time.perf_counter()
            results = step.launched.collect()
        except Exception as e:
            self._fail(step.batch, e)
            results = None
        if results is not None:
            now = time.perf_counter()
            if self._on_step is not None:  # the time this step held the pipeline's output
                self._on_step(now - max(step.t0, self._landed_at), len(step.batch))
            self._landed_at = now
            self._status = self._snapshot()
            for waiter in self._landing:
                with contextlib.suppress(InvalidStateError):  # its migration stopped waiting
                    waiter.set_result(now)
            self._landing.clear()
            for s, r in zip(step.batch, results):
                if s.stream is not None:  # not failed in the meantime
                    s.in_flight -= 1
                    self._deliver(s, r)
                    self._finish_if_done(s)
            self._flush()
            self._update_interest()
            self.step_times.add(len(step.batch), step.launch_s, t2 - t1, time.perf_counter() - t2)
        if not self._flight and self._held:
            with self._lock:
                self._held.extend(self._inbox)
                self._inbox, self._held = self._held, deque()

    def _fail(self, batch: list[EngineSession], error: Exception) -> None:
        log.error("engine step failed for %d streams", len(batch), exc_info=error)
        for s in batch:
            s.in_flight = 0
            if s.stream is not None:
                self._deliver(s, StreamFailed(f"engine step failed: {error}"))
                self._release(s)
        self._flush()

    def _finish_if_done(self, session: EngineSession) -> None:
        if session.stream is not None and not session.in_flight and session.stream.finished:
            self._deliver(session, None)
            self._release(session)

    def _release(self, session: EngineSession) -> None:
        if session.stream is not None:
            self.recognizer.close(session.stream)
            session.stream = None
        self._live.pop(session, None)
        self._ready_set.pop(session, None)
        self._touched.pop(session, None)

    def _deliver(self, session: EngineSession, item: ResultItem) -> None:
        """Queue `item` for the session; `_flush` hands everything queued over at once."""
        self._outbox.append((session, item))

    def _flush(self) -> None:
        """One wake-up of the event loop (and one call of each sink) for all that was delivered
        since the last flush."""
        if not self._outbox:
            return
        local: list[tuple[EngineSession, ResultItem]] = []
        sinks: dict[Sink, list[tuple[EngineSession, ResultItem]]] = {}
        for item in self._outbox:
            sink = item[0].sink
            if sink is None:
                local.append(item)
            else:
                sinks.setdefault(sink, []).append(item)
        self._outbox = []
        if local:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(_put_all, local)
        for sink, items in sinks.items():
            sink(items)


def _put_all(items: list[tuple[EngineSession, ResultItem]]) -> None:
    """On the event loop: hand a step's results to their sessions, in order."""
    for session, item in items:
        session.results.put_nowait(item)
