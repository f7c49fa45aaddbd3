"""The stream port of one process: HTTP routes (health, metrics, the browser page), stream
sessions, and their drain on shutdown. Runs in the engine's process, or in each front-end
process (`server/worker.py`)."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from http import HTTPStatus
from pathlib import Path
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from streamd.config import Config
from streamd.protocol import LISTEN_PATH, REALTIME_PATH, STREAM_PATH
from streamd.server.access import Access
from streamd.server.deepgram import ListenStream, listen_refusal
from streamd.server.context import StreamContext
from streamd.server.handler import Connection, FaceType
from streamd.server.http import GuardedConnection, quiet_client_handshake_faults, response, without_body
from streamd.server.metrics import CONTENT_TYPE
from streamd.server.native import NativeStream
from streamd.server.realtime import RealtimeStream
from streamd.server.resume import SESSION_HEADER, assign_session_id
from streamd.server.secrets import read_token, warn_if_exposed

log = logging.getLogger("streamd.server")
STATIC = Path(__file__).resolve().parent / "static"
# Frames websockets queues per connection before it stops reading the socket (it stops once more
# than this many wait, and resumes when none do): a paced (backlogged) client's connection then
# holds at most RECEIVE_QUEUE + 1 messages of max_message_bytes, plus one read of the socket
# (READ_BYTES), received and not yet taken (docs/protocol.md, "Memory per connection").
RECEIVE_QUEUE = 1
READ_BYTES = 256 << 10  # what asyncio reads from a socket at once
# The browser client (microphone capture over the same websocket protocol).
STATIC_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
                "/app.js": ("app.js", "text/javascript; charset=utf-8"),
                "/capture-worklet.js": ("capture-worklet.js", "text/javascript; charset=utf-8")}

# A plain GET of a stream path that a handshake would let in (with this token and origin).
ACCESS_GRANTED = b"access granted: open this path with a websocket handshake\n"

# The stream faces: the native protocol, OpenAI Realtime and Deepgram live, by path.
FACES: dict[str, FaceType] = {STREAM_PATH: NativeStream, REALTIME_PATH: RealtimeStream, LISTEN_PATH: ListenStream}


class Front:
    """The stream port of one process: HTTP routes, stream sessions, and their drain on shutdown.
    Runs in the engine's process, or in each front-end process (`server/worker.py`)."""

    def __init__(self, state: StreamContext, metrics_text: Callable[[], Awaitable[bytes]] | None = None) -> None:
        quiet_client_handshake_faults()
        self.state = state
        self.metrics_text = metrics_text
        self.configure(state.config)
        self.ready = False
        self.connections: set[ServerConnection] = set()  # stream connections whose handler runs

    def configure(self, config: Config) -> None:
        """Take `config` (at start and on a reload): the token file is read again."""
        cfg = config.server
        token = read_token(cfg.token_file, "stream token file") if cfg.token_file else None
        self.access = Access(token, cfg.allowed_origins, (*cfg.allowed_hosts, cfg.host, socket.gethostname()))
        self.state.config = config

    async def process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        """HTTP routes on the websocket port; None lets a stream handshake proceed."""
        if isinstance(conn, GuardedConnection):
            if conn.refusal is not None:
                return conn.refusal
            if conn.head_only:
                r = await self._route(conn, request)
                return without_body(r) if r is not None else response(
                    HTTPStatus.METHOD_NOT_ALLOWED, b"", extra={"Allow": "GET"})
        return await self._route(conn, request)

    async def _route(self, conn: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/livez":  # a stalled engine (a hung GPU call) rarely recovers: have the daemon restarted
            if self.state.stalled:
                return response(HTTPStatus.SERVICE_UNAVAILABLE, b"engine stalled\n")
            return response(HTTPStatus.OK, b"ok\n")
        if path == "/readyz":
            return self._readyz()
        if path == "/metrics":
            text = await self.metrics_text() if self.metrics_text else self.state.metrics.render()
            return response(HTTPStatus.OK, text, CONTENT_TYPE)
        if path in STATIC_FILES:
            name, kind = STATIC_FILES[path]
            return response(HTTPStatus.OK, (STATIC / name).read_bytes(), kind)
        if path not in FACES:
            return response(HTTPStatus.NOT_FOUND, b"not found\n")
        if refusal := self.access.check(request.path, request.headers):
            self.state.metrics.rejections.labels(reason=refusal.reason).inc()
            # the path without its query: a ?token= is never logged
            log.warning("refused %s from %s: HTTP %d, %s", path, conn.remote_address, refusal.status.value,
                        refusal.message.strip())
            extra = {"WWW-Authenticate": 'Bearer realm="streamd"'} if refusal.status == HTTPStatus.UNAUTHORIZED else None
            return response(refusal.status, refusal.message.encode(), extra=extra)
        if path == LISTEN_PATH and (bad := listen_refusal(request.path)) is not None:
            self.state.metrics.rejections.labels(reason="bad_request").inc()
            return bad
        if "websocket" not in request.headers.get("Upgrade", "").lower():
            # A plain GET: what a handshake with this token and origin would get, nothing opened
            # (the browser page asks this first: browsers do not show why a handshake failed).
            return response(HTTPStatus.UPGRADE_REQUIRED, ACCESS_GRANTED, extra={"Upgrade": "websocket"})
        if self.state.stalled:
            self.state.metrics.rejections.labels(reason="stalled").inc()
            return response(HTTPStatus.SERVICE_UNAVAILABLE, b"engine stalled\n", extra={"Retry-After": "5"})
        if not self.accepting:
            self.state.metrics.rejections.labels(reason="draining").inc()
            return response(HTTPStatus.SERVICE_UNAVAILABLE, b"draining\n", extra={"Retry-After": "5"})
        if self.full:
            self.state.metrics.rejections.labels(reason="overloaded").inc()
            return response(HTTPStatus.SERVICE_UNAVAILABLE, b"at capacity\n", extra={"Retry-After": "1"})
        self.state.make_room(self.state.streams())  # a stream whose client is gone makes room
        return None

    @property
    def limit(self) -> int:
        """Streams admitted: min(max_streams, the real-time estimate) (streamd.server.admission)."""
        return self.state.admission()[0]

    @property
    def full(self) -> bool:
        """No room for a new stream, even in place of a parked one (in any front end)."""
        return self.state.streams() - self.state.reclaimable() >= self.limit

    def _readyz(self) -> Response:
        """200 while new streams are taken; 503 while loading, draining, stalled, cutting over or
        full (a load balancer then sends streams elsewhere). The body says why, with the counts."""
        why = ("loading" if not self.ready else "draining" if not self.accepting else
               "stalled" if self.state.stalled else "cutting over" if self.state.cutting_over else
               "full" if self.full else None)
        limit, estimate = self.state.admission()
        body = {"ready": why is None, "reason": why, "streams": self.state.streams(), "limit": limit,
                "capacity_estimate": estimate, "max_streams": self.state.config.server.max_streams,
                "parked": self.state.parked()}
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
        self.state.count_live()
        self.connections.add(ws)
        self.state.metrics.connections.inc()
        self.state.metrics.streams_active.inc()
        try:
            path = ws.request.path.split("?", 1)[0] if ws.request is not None else STREAM_PATH
            await Connection(ws, self.state, FACES.get(path, NativeStream)).run()
        finally:
            if task in self.state.live:  # not when the connection carried a resume (native.NativeStream._carry)
                self.state.live.discard(task)
                self.state.metrics.streams_active.dec()
            self.state.count_live()
            self.connections.discard(ws)

    def listen(self, sock: socket.socket | None = None) -> AbstractAsyncContextManager[Server]:
        """The websocket server (an async context manager): on `sock` if given (a front-end
        process's SO_REUSEPORT socket), else on the configured host and port."""
        cfg = self.state.config.server
        where: dict[str, Any] = {"sock": sock} if sock is not None else {"host": cfg.host, "port": cfg.port}
        return serve(self.handler, **where, process_request=self.process_request,
                     process_response=self.process_response,
                     max_size=cfg.max_message_bytes, max_queue=RECEIVE_QUEUE, compression=None,
                     ssl=_tls_context(cfg.tls_cert, cfg.tls_key), create_connection=GuardedConnection,
                     open_timeout=cfg.handshake_timeout_s)

    async def drain(self) -> None:
        """After shutdown began: let live streams finish within drain_timeout_s, then cut the rest.
        The port keeps listening meanwhile: /readyz and new handshakes get 503 (see `accepting`)."""
        if self.state.live:
            await asyncio.wait(set(self.state.live), timeout=self.state.config.server.drain_timeout_s)
        if self.connections:  # past the drain timeout (e.g. a client that never reads): cut them
            log.warning("drain timeout: dropping %d connections", len(self.connections))
            for ws in self.connections:
                ws.transport.abort()


def _tls_context(cert: Any, key: Any) -> ssl.SSLContext | None:
    if cert is None:
        return None
    warn_if_exposed(Path(key or cert), "TLS private key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key) if key else None)
    return ctx
