"""The engine: one dedicated thread runs every model call; the event loop talks to it in typed
commands and reads its `EngineStatus` snapshot. The engine also serves live migration
(`Engine.migrate`, orchestrated by `engine/migration.py`: the copy is made off the thread, the
swap between two steps).

The event loop never touches tensors. It posts commands (`engine/inbox.py`) to the inbox; the
engine thread takes them, runs a step as soon as streams have a full chunk (waiting at most
`batch_wait_s` for more streams to fill the batch; on a GPU, while a step runs on the device, the
next is launched behind it, so that the host's work for one step overlaps the device's for the
other), and posts each stream's results back to its session's queue with `call_soon_threadsafe`,
or to the session's `sink` (a front-end process's bridge, see `server/frontends.py`). No polling:
the thread sleeps in the inbox's selector, woken by a post or by an `IoSource` (a front end's
channel, which the engine thread itself reads and writes between steps: no other thread of the
process then competes with steps for the GIL).
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from streamd import cuda_capture
from streamd.engine.cpus import ThreadCpu
from streamd.engine.inbox import (HELD, Audio, Call, Close, Command, End, Inbox, IoSource, Open, Outlet, Send,
                                  Stop, StreamCommand, Unwatch, Watch)
from streamd.engine.migration import MigrationReport, PreparedSteps, cut_over, migrate
from streamd.engine.placement import DTYPE_NAMES
from streamd.engine.recognizer import Launched, Recognizer
from streamd.engine.step_times import StepTimes
from streamd.engine.stream import Stream
from streamd.engine.types import Ended, EngineSession, EngineStatus, Handover, ResultItem, Sink, StepResults
from streamd.errors import StreamFailed
from streamd.model.transducer import Transducer

log = logging.getLogger("streamd.engine")

StepObserver = Callable[[float, int], None]  # (seconds, batch size)
STEP_POLL_S = 0.0005  # while a step runs on the device: how often the engine thread checks it


@dataclass(frozen=True, slots=True)
class _Step:
    """A launched step: its sessions in order, when its launch began and how long it took, and
    when the first of its streams became ready (perf_counter)."""

    batch: list[EngineSession]
    launched: Launched
    t0: float
    launch_s: float
    ready_at: float


class Engine:
    """The engine thread and the event loop's side of it (the module doc).

    `pipeline`: launch the next step while one runs on the device (None: when the model's
    device runs steps asynchronously, i.e. a GPU; on a CPU a launch computes the whole step, and
    launching another before delivering the first would only delay its results).

    `gil_switch_s`: the process's thread switch interval from `start` on (None: as it is). The
    engine thread re-takes the GIL after every torch call; while the event loop runs Python, each
    re-take waits up to this interval (CPython's default, 5 ms, made a busy daemon's steps many
    times slower).

    `thread_cpu`: a CPU for the engine thread alone while the model is on a GPU; from `start` to
    `stop` the starting thread (and the threads and processes it starts meanwhile: the front
    ends) keeps off it (`engine/cpus.py`). None: every thread may use every CPU."""

    def __init__(self, recognizer: Recognizer, max_batch: int, batch_wait_s: float,
                 on_step: StepObserver | None = None, pipeline: bool | None = None,
                 gil_switch_s: float | None = None, thread_cpu: int | None = None) -> None:
        self.recognizer = recognizer
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self.pipeline, self.gil_switch_s = pipeline, gil_switch_s
        self._cpu = ThreadCpu(thread_cpu) if thread_cpu is not None else None
        self._on_step = on_step
        self.inbox = Inbox()
        self._ids = itertools.count()  # engine stream ids
        self._live: dict[EngineSession, None] = {}  # sessions with a slot, oldest first
        # Readiness is tracked, not scanned for: only a session that got audio or ended (or just
        # stepped) is checked again, so the engine thread's work between steps does not grow with
        # the streams that are waiting for audio.
        self._touched: dict[EngineSession, None] = {}
        # ready streams in the order they became ready, and when (perf_counter; a stream ready
        # again as its step lands counts from then)
        self._ready_set: dict[EngineSession, float] = {}
        self._ended: list[Ended] = []  # streams flushed or failed since the last hand-over
        self._flight: deque[_Step] = deque()  # launched steps, oldest first (at most two)
        self._held: deque[Command] = deque()  # commands that wait until no step is in flight
        self._landed_at = 0.0  # when the last step's results were delivered (perf_counter)
        # How far behind serving is (read from any thread): seconds the oldest chunk of the last
        # landed step waited from its arrival to its results; 0 once nothing waits
        self.lag_s = 0.0
        self._progress_at = time.perf_counter()  # when the engine thread last launched or landed a step
        self.streams_failed = 0  # streams ended by a failed step since start (a migration reports its share)
        self._last_landed: Launched | None = None  # the step before the one landing next, on the device
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.died: asyncio.Event | None = None  # set (on the loop) if the engine thread stops on an error
        self.error: BaseException | None = None  # that error
        self._stopping = False
        self._cutting_over = False
        self._stalled = False  # said by the daemon's watchdog (`set_stalled`)
        self._migrating = asyncio.Lock()
        self._listeners: list[Callable[[], None]] = []
        # resolved when the next step lands: (when, when the first of its streams became ready)
        self._landing: list[Future[tuple[float, float]]] = []
        self._status = self._snapshot()
        self.step_times = StepTimes(memory=self._device_memory)

    def stalled(self, limit_s: float) -> str | None:
        """From any thread: None, or (when steps are in flight or streams wait for one and the
        engine thread has launched and landed none for `limit_s`) what it is doing, its Python
        stack included (a thread blocked in a CUDA call, a deadlock)."""
        idle = time.perf_counter() - self._progress_at
        waiting = len(self._flight) + len(self._ready_set)
        if idle < limit_s or not waiting or self._thread is None:
            return None
        frame = sys._current_frames().get(self._thread.ident or -1)
        where = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack: the thread is gone)\n"
        return (f"the engine thread has launched and landed no step for {idle:.0f} s with {len(self._flight)} "
                f"in flight and {len(self._ready_set)} streams ready; it is at:\n{where}")

    def _device_memory(self) -> str | None:
        """The serving device's memory in words (the caching allocator's counters: no CUDA call)."""
        device = self.recognizer.model.device
        if device.type != "cuda":
            return None
        gib = 2**30
        total = torch.cuda.get_device_properties(device).total_memory
        return (f"memory {torch.cuda.memory_allocated(device) / gib:.1f} GiB allocated, "
                f"{torch.cuda.memory_reserved(device) / gib:.1f} reserved of {total / gib:.0f}")

    # -- loop side -----------------------------------------------------------------------------
    def start(self) -> None:
        if self.gil_switch_s is not None:
            sys.setswitchinterval(self.gil_switch_s)
        if self._cpu is not None:
            self._cpu.keep_off()
        self._loop = asyncio.get_running_loop()
        self.died = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="streamd-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        if self.error is None:  # else the thread is gone, and its inbox closed
            self._post(Stop())
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        if self._cpu is not None:
            self._cpu.restore()

    @property
    def status(self) -> EngineStatus:
        """The latest snapshot (made on the engine thread after each step and migration)."""
        return self._status

    def _snapshot(self) -> EngineStatus:
        rec = self.recognizer
        return EngineStatus(str(rec.model.device), DTYPE_NAMES[rec.model.dtype], rec.geometry, rec.capacity,
                            rec.encoder_step.mode, getattr(rec.search, "mode", "eager"),
                            rec.model.encoder.attention_path(),
                            self._cutting_over, rec.eager_reason(), self._stalled, rec.calls, rec.eager_calls,
                            rec.padded_calls)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` on the event loop whenever a migration or a stall changes the status."""
        self._listeners.append(listener)

    async def migrate(self, master: Transducer, device: torch.device | None, dtype: torch.dtype | None
                      ) -> MigrationReport:
        """Move serving to a copy of `master` (fp32 CPU weights) at `device` / `dtype` (None: as
        now) while streams go on (`engine/migration.py`); one at a time. On failure the engine
        keeps serving where it was; the report says why."""
        async with self._migrating:
            return await migrate(self, master, device, dtype)

    def cut_over(self, rec: Recognizer, target: Transducer, staged: Any, steps: PreparedSteps
                 ) -> tuple[float, int, float, Future[tuple[float, float]] | None, Callable[[], None]]:
        """`migration.cut_over` on the engine thread (in a `Call`); also when the serving gap began
        at the earliest (the last landing, at most one chunk before the pause), a future of the
        next landing and when its first stream became ready (None: no stream is open), and the
        source's `release`. The streams ready at this moment may be none while thousands are open
        (their audio still in the inbox): the next landing is awaited whenever a stream is open."""
        paused = time.perf_counter()
        pause_ms, streams, release = cut_over(rec, target, staged, steps)
        # The target's graphs that this thread captures later (sizes not prepared) share no capture
        # stream with the source's, which `release` destroys (`streamd.cuda_capture`).
        cuda_capture.capture_on(f"{cuda_capture.CAPTURE}-{rec.prepared_on}")
        if self._cpu is not None:
            self._cpu.place(target.device.type)
        if steps.deferred:  # the first steps capture graphs: they need the source's memory
            release()
        landed: Future[tuple[float, float]] | None = None
        if rec.active:
            landed = Future()
            self._landing.append(landed)
        return pause_ms, streams, max(self._landed_at, paused - rec.geometry.chunk_ms / 1000), landed, release

    def set_stalled(self, on: bool) -> None:
        """On the event loop: the watchdog found the engine thread stalled (`stalled`), or making
        steps again; the status and its listeners know (the front ends then answer /livez and
        /readyz with 503). The engine thread's own snapshots keep the flag."""
        if on != self._stalled:
            self._stalled = on
            self._status = replace(self._status, stalled=on)
            for listener in self._listeners:
                listener()

    def set_cutting_over(self, on: bool) -> None:
        """A migration's cut-over begins (steps wait) or ends: the status and its listeners know."""
        self._cutting_over = on
        self._status = self._snapshot()
        for listener in self._listeners:
            listener()

    async def open(self) -> EngineSession:
        """A new stream with its own slot; raises CapacityError when all slots are taken."""
        session = EngineSession(id=next(self._ids))
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

    def submit(self, fn: Callable[[Recognizer], Any]) -> Future[Any]:
        """Run fn(recognizer) on the engine thread between two steps (from any thread)."""
        fut: Future[Any] = Future()
        self._post(Call(fn, fut))
        return fut

    def send(self, outlet: Outlet, messages: list[Any]) -> None:
        """Hand `messages` to `outlet` on the engine thread at its next turn, also while a step is
        in flight (from any thread)."""
        self._post(Send(outlet, messages))

    def post_many(self, commands: list[StreamCommand]) -> None:
        """Queue several stream commands at once, in order (from any thread: a front end's bridge
        hands over its streams' ends and closes this way; their audio it gives `take_audio`)."""
        self.inbox.post_many(commands)

    def _post(self, command: Command) -> None:
        self.inbox.post(command)

    def add_source(self, source: IoSource) -> None:
        """Serve `source` on the engine thread from its next turn on (from any thread)."""
        self._post(Watch(source))

    def detach(self, sources: list[IoSource]) -> Future[None]:
        """Stop serving `sources` and close them (from any thread); the future says when."""
        done: Future[None] = Future()
        self._post(Unwatch(sources, done))
        return done

    def remove_source(self, source: IoSource) -> None:
        """Stop serving `source` (on the engine thread; `add_source`'s inverse). Idempotent."""
        self.inbox.unwatch(source)

    # -- engine thread -------------------------------------------------------------------------
    def _run(self) -> None:
        if self._cpu is not None:
            self._cpu.place(self.recognizer.model.device.type)
        try:
            self._serve()
        except BaseException as e:  # a bug: said loudly, and the daemon exits (`died`)
            log.critical("the engine thread stopped on an error; nothing can be served", exc_info=e)
            self.error = e
            if self._loop is not None and self.died is not None:
                self._loop.call_soon_threadsafe(self.died.set)
        finally:
            self.inbox.close()

    def _serve(self) -> None:
        while not self._stopping:
            if not self._flight:
                ready = self._count_ready()
                if not ready:
                    self.lag_s = 0.0
                self._drain(None if not ready else 0)
                if self._stopping or not self._count_ready():
                    continue
                deadline = time.monotonic() + self.batch_wait_s
                target = min(self.max_batch, len(self._live))
                while self._count_ready() < target and (left := deadline - time.monotonic()) > 0:
                    self._drain(left)
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

    def _drain(self, timeout: float | None) -> None:
        """Apply what was posted and what the sources have; with nothing posted, first wait at
        most `timeout` seconds (None: until something comes, 0: not at all)."""
        self.inbox.wait(timeout)
        for command in self.inbox.take():
            self._apply(command)
        self._flush()
        self.inbox.update_interest()

    def _while_stepping(self, launched: Launched) -> None:
        """Until the device has run the launched step: serve the sources and take in audio
        (the engine thread would otherwise sit idle in `collect` for the GPU's share of the
        step). Stream commands and the named jobs (`Send`, `Watch`, `Unwatch`) are applied now: a
        slot closed and opened again is reset by the next launch, queued on the device behind
        the steps in flight, and a stream does not finish while a step of it is in flight. Calls
        (migrations, warm-up) and the stop are held until no step is in flight (`_land`), in
        order. Checks the device every `STEP_POLL_S` while the sockets are quiet."""
        timeout = 0.0
        while True:
            self.inbox.serve(timeout)
            for command in self.inbox.take():
                if isinstance(command, HELD):
                    self._held.append(command)
                else:
                    self._apply(command)
            if launched.done():
                return
            timeout = STEP_POLL_S

    def _apply(self, command: Command) -> None:
        match command:
            case Audio(session, samples):
                self.take_audio(session, samples)
            case End(session) if session.stream is not None:  # else closed or failed: ignored
                session.stream.end()
                self._touched[session] = None
                self._finish_if_done(session)
            case Close(session) if session.stream is not None:
                self._release(session)
            case Open(session, future) if future.set_running_or_notify_cancel():  # else its awaiter gave up
                try:
                    self._open(session)
                except BaseException as e:  # CapacityError: handed to whoever awaits the open
                    future.set_exception(e)
                else:
                    future.set_result(None)
            case Call(fn, future) if future.set_running_or_notify_cancel():  # else its awaiter gave up
                try:
                    future.set_result(fn(self.recognizer))
                except BaseException as e:  # handed to the awaiting coroutine
                    future.set_exception(e)
            case Send(outlet, messages):
                outlet.send(messages)
            case Watch(source):
                self.inbox.watch(source)
            case Unwatch(sources, done):
                for source in sources:
                    self.inbox.unwatch(source)
                    source.close()
                with contextlib.suppress(InvalidStateError):  # its awaiter gave up (a stop's timeout)
                    done.set_result(None)
            case Stop():
                self._stopping = True

    def take_audio(self, session: EngineSession, samples: np.ndarray) -> None:
        """Queue `session`'s float32 samples now: on the engine thread only. Ignored once the
        stream has closed or failed."""
        if session.stream is not None and session.stream.push_audio(samples):
            self._ready_set.setdefault(session, time.perf_counter())

    def take_pieces(self, sessions: list[EngineSession | None], sizes: list[int], samples: np.ndarray) -> None:
        """Queue many streams' audio now, on the engine thread only (a front end's bridge, which
        runs there, hands its streams' audio over this way, not as commands): sizes[i] float32
        samples of sessions[i], one after the other in `samples`, as `take_audio` would one by one
        but in a few numpy calls for all (`SlotAudio.push_many`). A None session, or one whose
        stream has closed or failed, is skipped."""
        live = [i for i, s in enumerate(sessions) if s is not None and s.stream is not None]
        if not live:
            return
        taken = [sessions[i] for i in live]
        size = np.asarray(sizes, dtype=np.int64)
        start = np.cumsum(size) - size
        pick = np.asarray(live, dtype=np.int64) if len(live) < len(sessions) else slice(None)
        slots = np.fromiter((s.stream.slot for s in taken), np.int64, len(taken))  # type: ignore[union-attr]
        ready = self.recognizer.audio.push_many(slots, start[pick], size[pick], samples)
        now = time.perf_counter()
        for s in itertools.compress(taken, ready.tolist()):
            self._ready_set.setdefault(s, now)  # type: ignore[arg-type]

    def _open(self, session: EngineSession) -> None:
        session.stream = self.recognizer.open()
        self._live[session] = None

    def _count_ready(self) -> int:
        """Streams with a step's worth of input (`_ready_set`, brought up to date)."""
        if self._touched:
            touched = [s for s in self._touched if s.stream is not None]
            self._touched.clear()
            slots = np.fromiter((s.stream.slot for s in touched), np.int64, len(touched))  # type: ignore[union-attr]
            now = time.perf_counter()
            for s in itertools.compress(touched, self.recognizer.audio.ready(slots).tolist()):
                self._ready_set.setdefault(s, now)
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
            self._progress_at = time.perf_counter()  # the thread goes on (its streams failed)
            return
        ready_at = self._ready_set[batch[0]] if batch else t0  # the oldest: times rise in the set's order
        for s in batch:  # ready again only if more input is there
            del self._ready_set[s]
            self._touched[s] = None
            s.in_flight += 1
        self._flight.append(_Step(batch, launched, t0, time.perf_counter() - t0, ready_at))
        self._progress_at = time.perf_counter()

    def _land(self) -> None:
        """Wait for the oldest launched step (serving the sources meanwhile) and deliver its
        results; once no step is in flight, the held commands go first in the inbox."""
        step = self._flight.popleft()
        t1 = time.perf_counter()
        try:
            self._while_stepping(step.launched)
            t2 = time.perf_counter()
            results: StepResults | None = step.launched.collect()
        except Exception as e:
            self._fail(step.batch, e)
            results = None
        self._progress_at = time.perf_counter()
        if results is not None:
            now = time.perf_counter()
            self.lag_s = now - step.ready_at
            if self._on_step is not None:  # the time this step held the pipeline's output
                self._on_step(now - max(step.t0, self._landed_at), len(step.batch))
            self._landed_at = now
            self._status = self._snapshot()
            for waiter in self._landing:
                with contextlib.suppress(InvalidStateError):  # its migration stopped waiting
                    waiter.set_result((now, step.ready_at))
            self._landing.clear()
            batch = step.batch
            landed = [i for i, s in enumerate(batch) if s.stream is not None]  # not failed or closed meanwhile
            for i in landed:
                batch[i].in_flight -= 1
            slots = np.fromiter((batch[i].stream.slot for i in landed), np.int64, len(landed))  # type: ignore[union-attr]
            for i in itertools.compress(landed, self.recognizer.audio.finished(slots).tolist()):
                self._finish_if_done(batch[i])
            self._flush(batch, landed, results)
            self.inbox.update_interest()
            self.step_times.add(len(step.batch), step.launch_s, t2 - t1, time.perf_counter() - t2,
                                step.launched.device_s(self._last_landed), step.launched.ring_bytes,
                                step.launched.ring_wait_s)
            self._last_landed = step.launched
        if not self._flight and self._held:
            self.inbox.put_back(self._held)
            self._held = deque()

    def _fail(self, batch: list[EngineSession], error: Exception) -> None:
        log.error("engine step failed for %d streams", len(batch), exc_info=error)
        self.streams_failed += len(batch)
        for s in batch:
            s.in_flight = 0
            if s.stream is not None:
                self._ended.append((s, StreamFailed(f"engine step failed: {error}")))
                self._release(s)
        self._flush()

    def _finish_if_done(self, session: EngineSession) -> None:
        if session.stream is not None and not session.in_flight and session.stream.finished:
            self._ended.append((session, None))
            self._release(session)

    def _release(self, session: EngineSession) -> None:
        if session.stream is not None:
            self.recognizer.close(session.stream)
            session.stream = None
        self._live.pop(session, None)
        self._ready_set.pop(session, None)
        self._touched.pop(session, None)

    def _flush(self, batch: list[EngineSession] | None = None, landed: list[int] | None = None,
               results: StepResults | None = None) -> None:
        """Hand over what is due, in one wake-up of the event loop and one call of each sink:
        row i of a landed step's `results` is for `batch[i]` (for the `landed` indices: the
        streams still open), then the streams flushed or failed since the last hand-over."""
        if not self._ended and not landed:
            return
        by_sink: dict[Sink | None, tuple[list[EngineSession], list[int], list[Ended]]] = {}
        for i in landed or ():
            s = batch[i]  # type: ignore[index]
            if (group := by_sink.get(s.sink)) is None:
                group = by_sink[s.sink] = ([], [], [])
            group[0].append(s)
            group[1].append(i)
        for item in self._ended:
            if (group := by_sink.get(item[0].sink)) is None:
                group = by_sink[item[0].sink] = ([], [], [])
            group[2].append(item)
        self._ended = []
        for sink, (sessions, rows, ended) in by_sink.items():
            picked = results.rows(np.asarray(rows, dtype=np.int64)) if sessions and results is not None else None
            handover = Handover(sessions, picked, ended)
            if sink is None:
                assert self._loop is not None
                self._loop.call_soon_threadsafe(_put_all, handover.items())
            else:
                sink(handover)


def _put_all(items: list[tuple[EngineSession, ResultItem]]) -> None:
    """On the event loop: hand a step's results to their sessions, in order."""
    for session, item in items:
        session.results.put_nowait(item)
