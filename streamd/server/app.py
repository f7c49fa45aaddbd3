"""The daemon's lifecycle: load and warm the model, serve websockets plus health and metrics on
one port, drain on SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import ssl
import sys
from pathlib import Path
from http import HTTPStatus
from typing import Any

import numpy as np
import torch
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from streamd import systemd
from streamd.config import Config
from streamd.decoding.graphs import EAGER, make_decoder
from streamd.engine.encoder_step import make_encoder_step
from streamd.engine.migration import prepare
from streamd.engine.placement import DTYPE_NAMES, parse_device, parse_dtype
from streamd.engine.recognizer import Recognizer
from streamd.engine.scheduler import Engine
from streamd.model.checkpoint import load_model, resolve_model_path
from streamd.server.access import Access
from streamd.server.admission import Capacity, probe, probe_sizes
from streamd.server.admin import AdminServer, Control
from streamd.server.handler import Connection, ServerState
from streamd.server.metrics import CONTENT_TYPE, Metrics
from streamd.server.http import GuardedConnection, quiet_client_handshake_faults, response, without_body
from streamd.server.protocol import STREAM_PATH
from streamd.server.realtime import REALTIME_PATH, RealtimeConnection
from streamd.server.resume import SESSION_HEADER, Sessions, assign_session_id
from streamd.server.secrets import read_token, warn_if_exposed

log = logging.getLogger("streamd.server")
# CUDA-graph decoders per octave of batch sizes: a step of few streams does not pay for capacity.
DECODER_BUCKETS_PER_OCTAVE = 4
STATIC = Path(__file__).resolve().parent / "static"
# Messages websockets buffers per connection before it stops reading the socket: with a paced
# (backlogged) client this bounds what one connection holds to RECEIVE_QUEUE * max_message_bytes.
RECEIVE_QUEUE = 4
# The browser client (microphone capture over the same websocket protocol).
STATIC_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
                "/app.js": ("app.js", "text/javascript; charset=utf-8"),
                "/capture-worklet.js": ("capture-worklet.js", "text/javascript; charset=utf-8")}


def build_state(cfg: Config, metrics: Metrics) -> ServerState:
    """Load the model where the config says and wrap it in an engine (not started)."""
    e = cfg.engine
    loaded = load_model(resolve_model_path(e.model))
    device = parse_device(e.resolved_device(torch.cuda.is_available()))
    dtype = parse_dtype(e.dtype)
    if e.right_context is not None:
        loaded.model.encoder.set_att_context((loaded.model.encoder.att_context[0], e.right_context))
    capacity = cfg.server.max_streams
    mode = "auto" if e.cuda_graphs == "on" else EAGER

    def graph_fallback(reason: str) -> None:
        metrics.graph_fallbacks.inc()

    rec = Recognizer(prepare(loaded.model, device, dtype), capacity,
                     decoder_factory=lambda m: make_decoder(m, mode, per_octave=DECODER_BUCKETS_PER_OCTAVE),
                     encoder_factory=lambda m: make_encoder_step(m, mode, capacity, graph_fallback))
    chunk_s = rec.geometry.chunk_ms / 1000

    def capacity_changed(estimate: int, limit: int) -> None:
        metrics.capacity_estimate.set(estimate)
        metrics.capacity.set(limit)

    s = cfg.server
    admission = Capacity(chunk_s, s.max_streams, s.admission_utilization, s.admission == "capacity",
                         capacity_changed)
    capacity_changed(admission.estimate, admission.limit)

    def on_step(seconds: float, batch: int) -> None:
        metrics.observe_step(seconds, batch, chunk_s)
        admission.observe(seconds, batch)

    engine = Engine(rec, cfg.server.max_streams, e.batch_wait_ms / 1000, on_step)
    metrics.set_model(loaded.name, str(device), DTYPE_NAMES[dtype])
    return ServerState(cfg, engine, loaded.tokenizer, metrics, loaded.name, loaded.model,
                       sessions=Sessions(s.resume_grace_s), capacity=admission)


async def warm_up(engine: Engine) -> None:
    """One chunk of silence through the whole pipeline, so the first client does not pay for it."""
    session = await engine.open()
    engine.push(session, np.zeros(16000 * 2, dtype=np.float32))
    engine.end(session)
    while await session.results.get() is not None:
        pass


async def measure_capacity(state: ServerState) -> None:
    """Time batched steps at warm-up: the first capacity estimate (see streamd.server.admission),
    measured (and exported) even when `admission = "max_streams"` does not enforce it."""
    if state.capacity is not None:
        sizes = probe_sizes(state.config.server.max_streams)
        state.capacity.seed(await state.engine.call(lambda rec: probe(rec, sizes)))


class App:
    def __init__(self, state: ServerState) -> None:
        quiet_client_handshake_faults()
        self.state = state
        self.control = Control(state)
        cfg = state.config.server
        token = read_token(cfg.token_file, "stream token file") if cfg.token_file else None
        self.access = Access(token, cfg.allowed_origins)
        self.ready = False
        self.connections: set[ServerConnection] = set()  # stream connections whose handler runs

    def process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        """HTTP routes on the websocket port; None lets a stream handshake proceed."""
        if isinstance(conn, GuardedConnection):
            if conn.refusal is not None:
                return conn.refusal
            if conn.head_only:
                r = self._route(request)
                return without_body(r) if r is not None else response(
                    HTTPStatus.METHOD_NOT_ALLOWED, b"", extra={"Allow": "GET"})
        return self._route(request)

    def _route(self, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/livez":
            return response(HTTPStatus.OK, b"ok\n")
        if path == "/readyz":
            return self._readyz()
        if path == "/metrics":
            return response(HTTPStatus.OK, self.state.metrics.render(), CONTENT_TYPE)
        if path in STATIC_FILES:
            name, kind = STATIC_FILES[path]
            return response(HTTPStatus.OK, (STATIC / name).read_bytes(), kind)
        if path not in (STREAM_PATH, REALTIME_PATH):
            return response(HTTPStatus.NOT_FOUND, b"not found\n")
        if refusal := self.access.check(request.path, request.headers):
            self.state.metrics.rejections.labels(reason=refusal.reason).inc()
            extra = {"WWW-Authenticate": 'Bearer realm="streamd"'} if refusal.status == HTTPStatus.UNAUTHORIZED else None
            return response(refusal.status, refusal.message.encode(), extra=extra)
        if not self.accepting:
            self.state.metrics.rejections.labels(reason="draining").inc()
            return response(HTTPStatus.SERVICE_UNAVAILABLE, b"draining\n", extra={"Retry-After": "5"})
        if self.full:
            self.state.metrics.rejections.labels(reason="overloaded").inc()
            return response(HTTPStatus.SERVICE_UNAVAILABLE, b"at capacity\n", extra={"Retry-After": "1"})
        if len(self.state.live) >= self.limit:
            self.state.sessions.evict()  # a stream whose client is gone makes room
        return None

    @property
    def limit(self) -> int:
        """Streams admitted: min(max_streams, the real-time estimate) (streamd.server.admission)."""
        cap = self.state.capacity
        return cap.limit if cap is not None else self.state.config.server.max_streams

    @property
    def full(self) -> bool:
        """No room for a new stream, even in place of a parked one."""
        return len(self.state.live) - self.state.sessions.parked >= self.limit

    def _readyz(self) -> Response:
        """200 while new streams are taken; 503 while loading, draining, cutting over or full (a
        load balancer then sends streams elsewhere). The body says why, with the counts."""
        why = ("loading" if not self.ready else "draining" if not self.accepting else
               "cutting over" if self.state.cutting_over else "full" if self.full else None)
        cap = self.state.capacity
        body = {"ready": why is None, "reason": why, "streams": len(self.state.live), "limit": self.limit,
                "capacity_estimate": cap.estimate if cap is not None else None,
                "max_streams": self.state.config.server.max_streams,
                "parked": self.state.sessions.parked}
        return response(HTTPStatus.OK if why is None else HTTPStatus.SERVICE_UNAVAILABLE,
                        (json.dumps(body) + "\n").encode(), "application/json")

    def process_response(self, conn: ServerConnection, request: Request, response: Response) -> Response:
        """A stream's handshake answer names its session (`X-Streamd-Session`): a load balancer
        can route a resume of it back here (deploy/haproxy)."""
        if response.status_code == HTTPStatus.SWITCHING_PROTOCOLS and request.path.startswith(STREAM_PATH):
            response.headers[SESSION_HEADER] = assign_session_id(conn)
        return response

    @property
    def accepting(self) -> bool:
        """New streams are taken: warmed up, not draining, not shutting down."""
        return self.ready and not self.state.draining and not self.state.shutdown.is_set()

    async def handler(self, ws: ServerConnection) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.state.live.add(task)
        self.connections.add(ws)
        self.state.metrics.connections.inc()
        self.state.metrics.streams_active.inc()
        try:
            realtime = ws.request is not None and ws.request.path.split("?", 1)[0] == REALTIME_PATH
            await (RealtimeConnection if realtime else Connection)(ws, self.state).run()
        finally:
            if task in self.state.live:  # not when the connection carried a resume (handler.Connection._carry)
                self.state.live.discard(task)
                self.state.metrics.streams_active.dec()
            self.connections.discard(ws)

    async def serve(self, started: asyncio.Future[int] | None = None) -> None:
        """Run until SIGTERM/SIGINT (or `state.shutdown` is set); `started` receives the port."""
        cfg = self.state.config.server
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.state.shutdown.set)
            except (RuntimeError, ValueError):  # not the main thread (tests)
                pass
        notifier = systemd.Notifier()
        # The engine thread re-takes the GIL after every torch call; while the event loop runs
        # Python, each re-take waits up to this interval (CPython's default, 5 ms, made a busy
        # daemon's steps many times slower).
        sys.setswitchinterval(self.state.config.engine.gil_switch_ms / 1000)
        tls = _tls_context(cfg.tls_cert, cfg.tls_key)
        admin = AdminServer(self.control, self.state.config.admin)
        await admin.start()  # first: a socket path in use fails the start before any work
        try:
            self.state.engine.start()
            await warm_up(self.state.engine)
            await measure_capacity(self.state)
            async with serve(self.handler, cfg.host, cfg.port, process_request=self.process_request,
                             process_response=self.process_response,
                             max_size=cfg.max_message_bytes, max_queue=RECEIVE_QUEUE, compression=None,
                             ssl=tls, create_connection=GuardedConnection,
                             open_timeout=cfg.handshake_timeout_s) as server:
                port = _bound_port(server)
                self.ready = True
                log.info("serving %s on %s://%s:%d%s (%s, %s)", self.state.model_name, "wss" if tls else "ws",
                         cfg.host, port, STREAM_PATH, self.state.device, self.state.dtype)
                notifier.ready(f"serving on port {port}")
                if started is not None:
                    started.set_result(port)
                watchdog = asyncio.create_task(_watchdog(notifier))
                await self.state.shutdown.wait()
                notifier.stopping(f"draining {len(self.state.live)} streams")
                log.info("draining %d streams", len(self.state.live))
                # Keep listening while draining: /readyz and new handshakes get 503 (see `accepting`).
                if self.state.live:
                    await asyncio.wait(set(self.state.live), timeout=cfg.drain_timeout_s)
                if self.connections:  # past the drain timeout (e.g. a client that never reads): cut them
                    log.warning("drain timeout: dropping %d connections", len(self.connections))
                    for ws in self.connections:
                        ws.transport.abort()
                watchdog.cancel()
        finally:
            await admin.stop()
            await self.state.engine.stop()


async def _watchdog(notifier: systemd.Notifier) -> None:
    interval = notifier.watchdog_interval
    if interval is None:
        return
    while True:
        notifier.watchdog()
        await asyncio.sleep(interval)


def _bound_port(server: Server) -> int:
    return int(next(iter(server.sockets)).getsockname()[1])


def _tls_context(cert: Any, key: Any) -> ssl.SSLContext | None:
    if cert is None:
        return None
    warn_if_exposed(Path(key or cert), "TLS private key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key) if key else None)
    return ctx
