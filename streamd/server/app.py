"""The daemon's lifecycle: load and warm the model, serve websockets plus health and metrics on
one port, re-read the configuration on SIGHUP, drain on SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import torch
from websockets.asyncio.server import Server, ServerConnection

from streamd import systemd
from streamd.log import set_levels
from streamd.config import Config
from streamd.errors import EngineDied, StreamdError
from streamd.decoding.graphs import EAGER, make_decoder
from streamd.engine.encoder_step import GRAPHS, make_encoder_step
from streamd.engine.migration import placed_copy
from streamd.engine.probes import capacity_probe
from streamd.engine.placement import DTYPE_NAMES, parse_device, parse_dtype
from streamd.engine.recognizer import PART_ROWS, Recognizer
from streamd.engine.engine import Engine
from streamd.model.checkpoint import load_model, resolve_model_path
from streamd.protocol import STREAM_PATH
from streamd.server.admin import AdminServer, Control
from streamd.server.admission import Capacity, probe_sizes
from streamd.server.front import Front
from streamd.server.frontends import FrontEnds
from streamd.server.context import ServerState
from streamd.server.heap import freeze_startup_heap
from streamd.server.loop_watch import LoopLoad, watch
from streamd.server.metrics import Metrics
from streamd.server.ports import BIND_ERRORS, bind_error
from streamd.server.reload import describe, merge
from streamd.server.resume import Sessions

log = logging.getLogger("streamd.server")
# CUDA-graph decoders per octave of batch sizes: a step of few streams does not pay for capacity.
DECODER_BUCKETS_PER_OCTAVE = 4
DRAINED_POLL_S = 0.2  # how often a `drain --exit` looks for its last stream's end
STALL_S = 60.0  # an engine thread with streams waiting and no step launched or landed this long is stalled
STALL_CHECK_S = 5.0  # how often the watchdog task looks


def build_state(cfg: Config, metrics: Metrics) -> ServerState:
    """Load the model where the config says and wrap it in an engine (not started)."""
    e = cfg.engine
    loaded = load_model(resolve_model_path(e.model))
    device = parse_device(e.resolved_device(torch.cuda.is_available()))
    dtype = parse_dtype(e.dtype)
    att_context = loaded.model.dims.att_context_with_right(e.right_context)
    capacity = cfg.server.max_streams
    mode = "auto" if e.cuda_graphs == "on" else EAGER

    def graph_fallback(reason: str) -> None:
        metrics.graph_fallbacks.inc()

    rec = Recognizer(placed_copy(loaded.model, device, dtype), capacity, att_context,
                     search_factory=lambda m: make_decoder(m, mode, per_octave=DECODER_BUCKETS_PER_OCTAVE),
                     # graphs' static buffers for one launched part, not for every slot
                     encoder_factory=lambda m: make_encoder_step(m, mode, min(capacity, PART_ROWS), graph_fallback),
                     keep_transcripts=False)
    chunk_s = rec.geometry.chunk_ms / 1000

    def capacity_changed(estimate: int, limit: int) -> None:
        metrics.capacity_estimate.set(estimate)
        metrics.capacity.set(limit)

    s = cfg.server
    admission = Capacity(chunk_s, s.max_streams, s.admission_utilization, s.admission == "capacity",
                         capacity_changed)
    capacity_changed(admission.estimate, admission.limit)

    def on_step(seconds: float, batch: int) -> None:  # on the engine thread
        metrics.observe_step(seconds, batch, chunk_s)
        metrics.set_graphs(rec.encoder_step.mode == GRAPHS, getattr(rec.search, "mode", EAGER) != EAGER)
        metrics.set_attention(rec.model.encoder.attention_path())
        metrics.set_calls(rec.calls, rec.eager_calls, rec.padded_calls)
        admission.observe(seconds, batch)

    engine = Engine(rec, cfg.server.max_streams, e.batch_wait_ms / 1000, on_step, gil_switch_s=e.gil_switch_ms / 1000,
                    thread_cpu=e.thread_cpu)
    metrics.set_model(loaded.name, str(device), DTYPE_NAMES[dtype])
    state = ServerState(cfg, loaded.tokenizer, metrics, loaded.name, engine=engine, master=loaded.model,
                        sessions=Sessions(s.resume_grace_s), capacity=admission)
    engine.add_listener(state.changed)  # a migration's cut-over and new placement reach the front ends
    return state


async def warm_up(engine: Engine, stop: Callable[[], bool] = lambda: False) -> None:
    """One chunk of silence through the whole pipeline, so the first client does not pay for it;
    with CUDA graphs, every batch bucket up to the engine's capacity is captured now (up to the
    next size once `stop()`, read on the engine thread, says the daemon is stopping)."""
    session = await engine.open()
    engine.push(session, np.zeros(2 * engine.recognizer.geometry.sample_rate, dtype=np.float32))
    engine.end(session)
    while await session.results.get() is not None:
        pass
    rec = engine.recognizer
    if rec.encoder_step.mode == GRAPHS:
        t0 = time.perf_counter()
        sizes = await engine.call(lambda r: r.capture_graphs(engine.max_batch, stop=stop))
        log.info("captured CUDA graphs for %d batch sizes up to %d in %.1f s", len(sizes), max(sizes, default=0),
                 time.perf_counter() - t0)


async def measure_capacity(state: ServerState) -> None:
    """Time batched steps at warm-up: the first capacity estimate (see streamd.server.admission),
    measured (and exported) even when `admission = "max_streams"` does not enforce it."""
    if state.capacity is not None:
        sizes = probe_sizes(state.config.server.max_streams)
        state.capacity.seed(await state.engine.call(lambda rec: capacity_probe(rec, sizes, stop=state.shutdown.is_set)))


class App:
    """The daemon: engine, admin socket, and the stream port (served here, or by
    `server.workers` front-end processes). `reread` loads the configuration again (on SIGHUP)."""

    def __init__(self, state: ServerState, reread: Callable[[], Config] | None = None) -> None:
        self.state = state
        self.reread = reread
        self.notifier = systemd.Notifier()
        self.control = Control(state)
        self.front = Front(state)
        self.fronts: FrontEnds | None = None  # with `server.workers`

    @property
    def connections(self) -> set[ServerConnection]:
        return self.front.connections

    async def serve(self, started: asyncio.Future[int] | None = None) -> None:
        """Run until SIGTERM/SIGINT (or `state.shutdown` is set); `started` receives the port."""
        cfg = self.state.config.server
        loop = asyncio.get_running_loop()
        _on_signals(loop, (signal.SIGTERM, signal.SIGINT), self.state.shutdown.set)
        notifier = self.notifier
        admin = AdminServer(self.control, self.state.config.admin)
        await admin.start()  # first: a socket path in use fails the start before any work
        try:
            self.state.engine.start()
            notifier.status(f"warming up on {self.state.device} {self.state.dtype}")  # `systemctl status`
            # A stop signal ends the start before serving: the phase's engine call returns at its
            # next batch size (it reads `shutdown`, set by the signal's handler, on the engine thread).
            stopping = self.state.shutdown
            await _start_phase(self.state.engine, warm_up(self.state.engine, stop=stopping.is_set), stopping)
            notifier.status("measuring step times for the capacity estimate")
            await _start_phase(self.state.engine, measure_capacity(self.state), stopping)
            freeze_startup_heap()
            async with contextlib.AsyncExitStack() as stack:
                try:
                    if cfg.workers:
                        self.fronts = FrontEnds(self.state, cfg.workers)
                        port = await self.fronts.start()
                    else:
                        port = _bound_port(await stack.enter_async_context(self.front.listen()))
                        self.front.ready = True
                except OSError as e:
                    if e.errno not in BIND_ERRORS:
                        raise
                    raise bind_error(e, cfg.host, cfg.port, "--port", late=True) from None
                if stopping.is_set():  # a stop signal while the front ends started
                    raise StoppedStarting
                # Before the log line and READY=1 that a reload may follow at once (a test, `systemctl
                # reload`): until this call SIGHUP is ignored (cli.py), and one sent then was lost.
                _on_signals(loop, (signal.SIGHUP,), self.reload)
                tls, host = "s" if cfg.tls_cert else "", _url_host(cfg.host)
                log.info("serving %s on ws%s://%s:%d%s (%s, %s%s); browser page http%s://%s:%d/", self.state.model_name,
                         tls, host, port, STREAM_PATH, self.state.device, self.state.dtype,
                         f", {cfg.workers} front-end processes" if cfg.workers else "", tls, host, port)
                notifier.ready(f"serving on port {port}")
                if started is not None:
                    started.set_result(port)
                watchdog = asyncio.create_task(_watchdog(notifier, self.state.engine))
                if not cfg.workers:  # front ends watch their own loops (server/worker.py)
                    load = LoopLoad("the daemon", self.state.metrics, cpu=None)  # the engine thread's CPU too
                    stack.callback(asyncio.create_task(watch(load, lambda: len(self.state.live))).cancel)
                exiter = asyncio.create_task(self._exit_when_drained())
                await _until_either(self.state.shutdown, self.state.engine.died)
                exiter.cancel()
                if self.state.engine.error is not None:  # nothing more can be served: exit at once
                    notifier.stopping("the engine thread failed")
                    raise _died(self.state.engine)
                notifier.stopping(f"draining {self.state.streams()} streams")
                log.info("draining %d streams", self.state.streams())
                if self.fronts is not None:
                    await self.fronts.stop()
                else:
                    await self.front.drain()
                watchdog.cancel()
        except StoppedStarting:
            notifier.stopping("stopped while starting")
            log.info("stopped by a signal while starting, before serving")
        finally:
            if self.fronts is not None:
                await self.fronts.kill()
            await admin.stop()
            await self.state.engine.stop()
        log.info("stopped")

    async def _exit_when_drained(self) -> None:
        """`admin drain --exit`: shut down (exit 0) once the last stream has ended."""
        while not self.control.drained():
            await asyncio.sleep(DRAINED_POLL_S)
        log.info("drained: the last stream ended; exiting (admin drain --exit)")
        self.state.shutdown.set()

    def reload(self) -> None:
        """SIGHUP: re-read the configuration; apply what can change live (streamd.server.reload),
        log what needs a restart. A configuration that fails to load changes nothing."""
        if self.reread is None:
            log.warning("SIGHUP: this daemon was not started from a configuration; nothing to reload")
            return
        self.notifier.reloading("reloading the configuration")
        old = self.state.config
        try:
            new = self.reread()
            config, live, restart = merge(old, new)
            self.front.configure(config)  # re-reads the token file, which may fail
        except (StreamdError, ValueError, OSError) as e:
            log.error("reload failed, the running configuration is kept: %s", e)
        else:
            self.state.config = config
            set_levels(config.log.level, config.log.access)
            if self.fronts is not None:
                self.fronts.configure(config)
            log.info("configuration reloaded%s", f": {describe(old, new, live)}" if live else ", nothing changed live")
            if restart:
                log.warning("these settings need a restart to change: %s", describe(old, new, restart))
        self.notifier.ready(f"serving {self.state.streams()} streams")


class StoppedStarting(Exception):
    """A stop signal came before the daemon served (`App.serve` then stops quietly)."""


async def _start_phase(engine: Engine, work: Coroutine[Any, Any, None], stop: asyncio.Event) -> None:
    """Await a phase of the start, `work` (which waits for the engine thread), or raise
    `EngineDied` if that thread stops on an error first (its calls would then never be answered),
    or `StoppedStarting` once `stop` is set (work is cancelled; an engine call it awaits ends on
    its own)."""
    task = asyncio.ensure_future(work)
    waits = {task} | {asyncio.ensure_future(e.wait()) for e in (engine.died, stop) if e is not None}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in waits:
            if not f.done():
                f.cancel()
    if engine.error is not None:
        raise _died(engine)
    if not task.done():
        raise StoppedStarting
    task.result()


def _died(engine: Engine) -> EngineDied:
    return EngineDied(f"the engine thread stopped on an error ({engine.error!r}); the daemon exits: "
                      "see the log's traceback")


async def _until_either(*events: asyncio.Event | None) -> None:
    """Wait until one of `events` is set (None: never)."""
    waits = [asyncio.ensure_future(e.wait()) for e in events if e is not None]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def _on_signals(loop: asyncio.AbstractEventLoop, signals: tuple[int, ...], act: Callable[[], None]) -> None:
    for sig in signals:
        try:
            loop.add_signal_handler(sig, act)
        except (RuntimeError, ValueError):  # not the main thread (tests)
            pass


async def _watchdog(notifier: systemd.Notifier, engine: Engine, stall_s: float = STALL_S) -> None:
    """Feed systemd's watchdog (if it has one) while the engine makes progress. An engine thread
    that has launched and landed no step for `stall_s` while streams wait (blocked in a CUDA call,
    a deadlock) is logged once, with its stack, the engine's status says so (/livez and /readyz
    answer 503, new streams are refused: an orchestrator restarts the daemon, a load balancer
    sends streams elsewhere), and the watchdog is no longer fed: systemd then restarts the daemon
    (`WatchdogSec=`, `Restart=`). All of it is undone if steps go on."""
    interval = notifier.watchdog_interval
    reported = False
    while True:
        stall = engine.stalled(stall_s)
        engine.set_stalled(stall is not None)
        if stall is None:
            if reported:
                log.warning("engine: steps go on again after a stall")
            reported = False
            if interval is not None:
                notifier.watchdog()
        elif not reported:
            reported = True
            log.error("engine stalled (/livez and /readyz answer 503%s): %s",
                      "; no longer feeding systemd's watchdog" if interval is not None else "", stall)
        await asyncio.sleep(min(interval, STALL_CHECK_S) if interval is not None else STALL_CHECK_S)


def _url_host(host: str) -> str:
    """`host` as a URL names it: an IPv6 address in brackets (ws://[::1]:8765, not ws://::1:8765)."""
    return f"[{host}]" if ":" in host else host


def _bound_port(server: Server) -> int:
    return int(next(iter(server.sockets)).getsockname()[1])
