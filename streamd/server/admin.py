"""The admin control plane: status, migrate, drain.

Two transports speak the same small HTTP/1.1 JSON API (`GET /v1/status`, `POST /v1/migrate`
with `{"device": ..., "dtype": ...}`, `POST /v1/drain`):
- a Unix socket (mode 0600); only peers with the daemon's uid (or root) are served;
- optionally TCP, where every request needs `Authorization: Bearer <token>` (token from a file).
The streaming port never reaches any of this.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import socket
import struct
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any

from streamd.config import AdminConfig
from streamd.engine.migration import MigrationFailed, MigrationReport, cut_over, placement, prepare, stage_cache
from streamd.engine.placement import DTYPE_NAMES, parse_device, parse_dtype
from streamd.server.handler import ServerState

log = logging.getLogger("streamd.admin")
MAX_BODY = 64 * 1024


class Control:
    """What the admin commands do, independent of transport."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.last_migration: MigrationReport | None = None
        self._lock = asyncio.Lock()

    def status(self) -> dict[str, Any]:
        rec = self.state.engine.recognizer
        return {"model": self.state.model_name, "device": self.state.device, "dtype": self.state.dtype,
                "streams": len(self.state.live), "capacity": rec.capacity,
                "chunk_ms": rec.geometry.chunk_ms, "decoder": getattr(rec.decoder, "mode", "eager"),
                "draining": self.state.draining, "shutting_down": self.state.shutdown.is_set(),
                "last_migration": self.last_migration.as_dict() if self.last_migration else None}

    def drain(self) -> dict[str, Any]:
        self.state.draining = True
        log.info("admin: draining (no new streams; %d live)", len(self.state.live))
        return self.status()

    async def migrate(self, device: str | None, dtype: str | None) -> MigrationReport:
        async with self._lock:
            rec = self.state.engine.recognizer
            source = placement(rec.model)
            report = MigrationReport(False, source, f"{device} {dtype}", 0.0, 0.0, len(self.state.live), at=time.time())
            try:
                dev = parse_device(device) if device else rec.model.device
                dt = parse_dtype(dtype) if dtype else rec.model.dtype
                report.target = f"{dev} {DTYPE_NAMES[dt]}"
                t0 = time.perf_counter()
                target = await asyncio.to_thread(prepare, self.state.master, dev, dt,
                                                 rec.model.encoder.att_context, True)
                staged = await asyncio.to_thread(stage_cache, target, rec.capacity)
                report.prepare_ms = (time.perf_counter() - t0) * 1000
                self.state.cutting_over = True
                try:
                    report.pause_ms, report.streams = await self.state.engine.call(
                        lambda r: cut_over(r, target, staged))
                finally:
                    self.state.cutting_over = False
                report.ok = True
            except (ValueError, MigrationFailed, RuntimeError) as e:  # OOM is a RuntimeError
                report.error = str(e)
            m = self.state.metrics
            m.migrations.labels(result="ok" if report.ok else "failed").inc()
            if report.ok:
                m.migration_pause.observe(report.pause_ms / 1000)
                m.set_model(self.state.model_name, self.state.device, self.state.dtype)
            log.info("admin: migrate %s -> %s: %s", source, report.target,
                     f"ok, paused {report.pause_ms:.1f} ms" if report.ok else f"failed ({report.error}); still on {source}")
            self.last_migration = report
            return report


class AdminServer:
    def __init__(self, control: Control, cfg: AdminConfig) -> None:
        self.control, self.cfg = control, cfg
        self._servers: list[asyncio.base_events.Server] = []
        self._token: str | None = None

    async def start(self) -> None:
        if self.cfg.socket is not None:
            path = Path(self.cfg.socket)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
            if path.is_socket():
                path.unlink()
            old = os.umask(0o177)  # the socket is created 0600: no window with looser rights
            try:
                server = await asyncio.start_unix_server(lambda r, w: self._client(r, w, "unix"), str(path))
            finally:
                os.umask(old)
            self._servers.append(server)
            log.info("admin socket %s", path)
        if self.cfg.port is not None and self.cfg.token_file is not None:
            self._token = Path(self.cfg.token_file).read_text().strip()
            if not self._token:
                raise ValueError(f"admin token file {self.cfg.token_file} is empty")
            server = await asyncio.start_server(lambda r, w: self._client(r, w, "tcp"), self.cfg.host, self.cfg.port)
            self._servers.append(server)
            log.info("admin TCP %s:%d (bearer token)", self.cfg.host, self.cfg.port)

    async def stop(self) -> None:
        for s in self._servers:
            s.close()
            await s.wait_closed()
        if self.cfg.socket is not None and Path(self.cfg.socket).is_socket():
            Path(self.cfg.socket).unlink()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, transport: str) -> None:
        try:
            status, body = await self._handle(reader, writer, transport)
        except (ValueError, asyncio.IncompleteReadError, json.JSONDecodeError) as e:
            status, body = HTTPStatus.BAD_REQUEST, {"ok": False, "error": f"bad request: {e}"}
        data = json.dumps(body).encode()
        writer.write(f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        try:
            await writer.drain()
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      transport: str) -> tuple[HTTPStatus, dict[str, Any]]:
        method, path, headers, body = await read_request(reader)
        who = self._authorise(writer, transport, headers)
        if who is None:
            log.warning("admin: refused %s %s over %s from %s", method, path, transport, writer.get_extra_info("peername"))
            return HTTPStatus.UNAUTHORIZED, {"ok": False, "error": "unauthorised"}
        log.info("admin: %s %s by %s", method, path, who)
        if (method, path) == ("GET", "/v1/status"):
            return HTTPStatus.OK, {"ok": True, **self.control.status()}
        if (method, path) == ("POST", "/v1/drain"):
            return HTTPStatus.OK, {"ok": True, **self.control.drain()}
        if (method, path) == ("POST", "/v1/migrate"):
            args = json.loads(body or b"{}")
            report = await self.control.migrate(args.get("device"), args.get("dtype"))
            status = HTTPStatus.OK if report.ok else HTTPStatus.CONFLICT
            return status, {"ok": report.ok, "migration": report.as_dict(), **self.control.status()}
        return HTTPStatus.NOT_FOUND, {"ok": False, "error": f"no route {method} {path}"}

    def _authorise(self, writer: asyncio.StreamWriter, transport: str, headers: dict[str, str]) -> str | None:
        """The caller's identity if it may use the admin API, else None."""
        if transport == "unix":
            uid = peer_uid(writer.get_extra_info("socket"))
            return f"uid {uid}" if uid in (0, os.getuid()) else None
        token = headers.get("authorization", "").removeprefix("Bearer ").strip()
        if self._token and token and hmac.compare_digest(token.encode(), self._token.encode()):
            return "bearer token"
        return None


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process on the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes]:
    """A minimal HTTP/1.1 request: method, path, lower-cased headers, body."""
    line = (await asyncio.wait_for(reader.readline(), 10)).decode("latin-1").strip()
    parts = line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP request line: {line[:80]!r}")
    headers: dict[str, str] = {}
    while (h := (await asyncio.wait_for(reader.readline(), 10)).decode("latin-1").strip()):
        k, _, v = h.partition(":")
        headers[k.strip().lower()] = v.strip()
        if len(headers) > 64:
            raise ValueError("too many headers")
    n = int(headers.get("content-length", "0"))
    if not 0 <= n <= MAX_BODY:
        raise ValueError("body too large")
    body = await asyncio.wait_for(reader.readexactly(n), 10) if n else b""
    return parts[0], parts[1].split("?", 1)[0], headers, body
