"""The admin control plane: status, migrate, drain, undrain.

Two transports speak the same small HTTP/1.1 JSON API (`GET /v1/status`, `POST /v1/migrate`
with `{"device": ..., "dtype": ...}`, `POST /v1/drain` with optional `{"handoff": true}` and
`{"exit": true}`, `POST /v1/undrain`):
- a Unix socket (mode 0600); only peers with the daemon's uid (or root) are served;
- optionally TCP, where every request needs `Authorization: Bearer <token>` (token from a file).
The streaming port never reaches any of this.
"""
from __future__ import annotations

import asyncio
import contextlib
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
from streamd.engine.migration import GAP_WAIT_S, MigrationReport
from streamd.engine.placement import parse_device, parse_dtype
from streamd.errors import ConfigError, echo
from streamd.server.context import ServerState
from streamd.server.secrets import read_token

log = logging.getLogger("streamd.admin")
MAX_BODY = 64 * 1024
MAX_HEAD_LINES = 64
READ_TIMEOUT_S = 10.0  # a request not complete by then gets 408


class BadRequest(ValueError):
    """The request is malformed (400), or too slow (408 with `status`)."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


class Control:
    """What the admin commands do, independent of transport."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.last_migration: MigrationReport | None = None
        self.exit_when_drained = False  # `drain --exit`: the daemon exits when its last stream ends

    def status(self) -> dict[str, Any]:
        engine = self.state.engine.status
        limit, estimate = self.state.admission()
        return {"model": self.state.model_name, "device": engine.device, "dtype": engine.dtype,
                "streams": self.state.streams(), "capacity": engine.capacity,
                "admission_limit": limit, "capacity_estimate": estimate,
                "parked": self.state.parked(),
                "chunk_ms": engine.geometry.chunk_ms, "decoder": engine.decoder, "encoder": engine.encoder,
                "attention": engine.attention,
                "eager_reason": engine.eager_reason, "calls": engine.calls,
                "eager_calls": dict(zip(("encoder", "decoder"), engine.eager_calls)),
                "padded_calls": dict(zip(("encoder", "decoder"), engine.padded_calls)), "stalled": engine.stalled,
                "draining": self.state.draining, "exit_when_drained": self.exit_when_drained,
                "shutting_down": self.state.shutdown.is_set(),
                "last_migration": self.last_migration.as_dict() if self.last_migration else None}

    def drain(self, handoff: bool = False, exit: bool = False) -> dict[str, Any]:
        """No new streams. With `handoff`, every live stream is also closed with code 1012 at
        once, for its client to resume it on another daemon (docs/protocol.md, Resume). With
        `exit`, the daemon exits (0) when its last stream has ended (see `App`); without it, it
        stays up, draining, until `undrain` or a signal."""
        self.state.draining = True
        self.exit_when_drained = self.exit_when_drained or exit
        self.state.changed()
        log.info("admin: draining (no new streams; %d live%s)", self.state.streams(),
                 "; exits when the last one ends" if self.exit_when_drained else "")
        handed = self.state.hand_off() if handoff else 0
        if handoff:
            log.info("admin: handed off %d streams", handed)
        return {**self.status(), "handed_off": handed}

    def undrain(self) -> dict[str, Any]:
        """Take new streams again (and no longer exit when drained)."""
        was = self.state.draining
        self.state.draining, self.exit_when_drained = False, False
        self.state.changed()
        log.info("admin: %s", "undrained: taking new streams again" if was else "undrain: was not draining")
        return self.status()

    def drained(self) -> bool:
        """`drain --exit` was asked and no stream is left: time to exit."""
        return self.exit_when_drained and self.state.draining and self.state.streams() == 0

    async def migrate(self, device: str | None, dtype: str | None) -> MigrationReport:
        """Move the serving model (the engine does it; see `Engine.migrate`); counted, logged."""
        try:
            dev, dt = (parse_device(device) if device else None), (parse_dtype(dtype) if dtype else None)
        except ValueError as e:
            status = self.state.engine.status
            here = f"{status.device} {status.dtype}"
            target = " ".join(part for part in (device, dtype) if part)  # what was asked; not "cuda None"
            report = MigrationReport(False, here, target, 0.0, 0.0, self.state.streams(),
                                     error=str(e), at=time.time())
        else:
            report = await self.state.engine.migrate(self.state.master, dev, dt)
        if not report.moved:
            log.info("admin: migrate to %s: already there, nothing to do", report.source)
            return report
        m = self.state.metrics
        m.migrations.labels(result="ok" if report.ok else "failed").inc()
        if report.ok:
            gap = report.serving_gap_ms
            m.observe_migration(report.pause_ms / 1000, report.recapture_ms / 1000, None if gap is None else gap / 1000)
            m.set_model(self.state.model_name, self.state.device, self.state.dtype)
        gap_text = (f"serving gap {report.serving_gap_ms:.1f} ms" if report.serving_gap_ms is not None
                    else "no streams, no serving gap" if not report.streams
                    else f"no step landed within {GAP_WAIT_S:.0f} s after")
        log.info("admin: migrate %s -> %s: %s", report.source, report.target,
                 f"ok, paused {report.pause_ms:.1f} ms, {gap_text}; prepared in {report.prepare_ms:.0f} ms "
                 f"({report.graphs or 'no graphs'} captured in {report.recapture_ms:.0f} ms"
                 f"{f', {report.paced_ms:.0f} ms waited between captures' if report.paced_ms else ''}"
                 f"{f' ({report.behind_ms:.0f} ms of them while serving was behind)' if report.behind_ms else ''}"
                 f"{f', {report.graphs_deferred} left to their first step' if report.graphs_deferred else ''})" if report.ok
                 else f"failed ({report.error}); still on {report.source}")
        if report.streams_failed:
            log.error("admin: %d streams were ended by failed engine steps during the migration to %s",
                      report.streams_failed, report.target)
        self.last_migration = report
        return report


class AdminServer:
    def __init__(self, control: Control, cfg: AdminConfig) -> None:
        self.control, self.cfg = control, cfg
        self._servers: list[asyncio.base_events.Server] = []
        self._token: str | None = None
        self._socket_inode: int | None = None  # our socket file: only it is removed on stop

    async def start(self) -> None:
        if self.cfg.socket is not None:
            path = Path(self.cfg.socket)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
            claim_socket_path(path)
            old = os.umask(0o177)  # the socket is created 0600: no window with looser rights
            try:
                server = await asyncio.start_unix_server(lambda r, w: self._client(r, w, "unix"), str(path))
            finally:
                os.umask(old)
            self._servers.append(server)
            self._socket_inode = path.stat().st_ino
            log.info("admin socket %s", path)
        if self.cfg.port is not None and self.cfg.token_file is not None:
            self._token = read_token(Path(self.cfg.token_file), "admin token file")
            server = await asyncio.start_server(lambda r, w: self._client(r, w, "tcp"), self.cfg.host, self.cfg.port)
            self._servers.append(server)
            log.info("admin TCP %s:%d (bearer token)", self.cfg.host, self.cfg.port)

    async def stop(self) -> None:
        for s in self._servers:
            s.close()
            await s.wait_closed()
        if self.cfg.socket is not None and self._socket_inode is not None:
            path = Path(self.cfg.socket)
            with contextlib.suppress(FileNotFoundError):
                if path.is_socket() and path.stat().st_ino == self._socket_inode:
                    path.unlink()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, transport: str) -> None:
        try:
            status, body = await self._handle(reader, writer, transport)
        except BadRequest as e:
            status, body = e.status, {"ok": False, "error": f"bad request: {e}"}
        except (ConnectionError, asyncio.IncompleteReadError):  # the client went away mid-request
            writer.close()
            return
        data = json.dumps(body).encode()
        try:
            writer.write(f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            await writer.drain()
        except ConnectionError:  # the client went away before its answer: nothing to tell it
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      transport: str) -> tuple[HTTPStatus, dict[str, Any]]:
        method, path, headers, body = await read_request(reader)
        who, why = self._authorise(writer, transport, headers)
        if who is None:
            log.warning("admin: refused %s %s over %s from %s: %s", method, path, transport,
                        writer.get_extra_info("peername"), why)
            return HTTPStatus.UNAUTHORIZED, {"ok": False, "error": f"unauthorised: {why}"}
        log.info("admin: %s %s by %s", method, path, who)
        if (method, path) == ("GET", "/v1/status"):
            return HTTPStatus.OK, {"ok": True, **self.control.status()}
        if (method, path) == ("POST", "/v1/drain"):
            return HTTPStatus.OK, {"ok": True, **self.control.drain(*drain_args(body))}
        if (method, path) == ("POST", "/v1/undrain"):
            return HTTPStatus.OK, {"ok": True, **self.control.undrain()}
        if (method, path) == ("POST", "/v1/migrate"):
            device, dtype = migrate_args(body)
            report = await self.control.migrate(device, dtype)
            status = HTTPStatus.OK if report.ok else HTTPStatus.CONFLICT
            return status, {"ok": report.ok, "migration": report.as_dict(), **self.control.status()}
        return HTTPStatus.NOT_FOUND, {"ok": False, "error": f"no route {method} {path}"}

    def _authorise(self, writer: asyncio.StreamWriter, transport: str,
                   headers: dict[str, str]) -> tuple[str | None, str]:
        """The caller's identity if it may use the admin API, else None and why not."""
        if transport == "unix":
            uid = peer_uid(writer.get_extra_info("socket"))
            if uid in (0, os.getuid()):
                return f"uid {uid}", ""
            return None, f"uid {uid} is neither root nor the daemon's user"
        scheme, _, token = headers.get("authorization", "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None, "no bearer token (give the admin token file with --token-file)"
        if self._token and hmac.compare_digest(token.encode(), self._token.encode()):
            return "bearer token", ""
        return None, "wrong bearer token"


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process on the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes]:
    """A minimal HTTP/1.1 request: method, path, lower-cased headers, body.

    Raises:
        BadRequest: malformed (400), or not complete within READ_TIMEOUT_S (408).
    """
    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            line = (await reader.readline()).decode("latin-1").strip()
            parts = line.split()
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                raise BadRequest(f"not an HTTP request line: {echo(line)}")
            headers: dict[str, str] = {}
            while (h := (await reader.readline()).decode("latin-1").strip()):
                k, _, v = h.partition(":")
                headers[k.strip().lower()] = v.strip()
                if len(headers) > MAX_HEAD_LINES:
                    raise BadRequest("too many headers")
            length = headers.get("content-length", "0")
            if not length.isdigit() or int(length) > MAX_BODY:
                raise BadRequest(f"Content-Length must be 0..{MAX_BODY}, got {echo(length)}")
            n = int(length)
            body = await reader.readexactly(n) if n else b""
    except TimeoutError:
        raise BadRequest(f"request not complete within {READ_TIMEOUT_S:g} s",
                         HTTPStatus.REQUEST_TIMEOUT) from None
    except (ValueError, asyncio.LimitOverrunError) as e:  # a line longer than the reader's limit
        if isinstance(e, BadRequest):
            raise
        raise BadRequest("request line or header too long") from None
    return parts[0], parts[1].split("?", 1)[0], headers, body


def _json_body(body: bytes) -> Any:
    """The parsed body (an empty one is `{}`); BadRequest if it is not JSON."""
    try:
        return json.loads(body or b"{}")
    except (ValueError, RecursionError):
        raise BadRequest("the body must be a JSON object") from None


def migrate_args(body: bytes) -> tuple[str | None, str | None]:
    """`{"device": str, "dtype": str}` (either may be left out, not both) from a migrate body.

    Raises:
        BadRequest: not such an object.
    """
    args = _json_body(body)
    if not isinstance(args, dict):
        raise BadRequest(f"the body must be a JSON object like {{\"device\": \"cuda:1\"}}, got {echo(args)}")
    unknown = sorted(set(args) - {"device", "dtype"})
    if unknown:
        raise BadRequest(f"unknown field {echo(unknown[0])}; allowed: device, dtype")
    for key in ("device", "dtype"):
        value = args.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise BadRequest(f'"{key}" must be a non-empty string, got {echo(value)}')
    if args.get("device") is None and args.get("dtype") is None:
        raise BadRequest('give "device", "dtype" or both')
    return args.get("device"), args.get("dtype")


def drain_args(body: bytes) -> tuple[bool, bool]:
    """(`handoff`, `exit`) from a drain body: `{}` or `{"handoff": bool, "exit": bool}`, either left
    out (an empty body is `{}`).

    Raises:
        BadRequest: not such an object.
    """
    args = _json_body(body)
    if (not isinstance(args, dict) or set(args) - {"handoff", "exit"}
            or not all(isinstance(v, bool) for v in args.values())):
        raise BadRequest(f'the body must be {{}} or like {{"handoff": true, "exit": true}}, got {echo(args)}')
    return bool(args.get("handoff", False)), bool(args.get("exit", False))


def claim_socket_path(path: Path) -> None:
    """Make `path` free for our admin socket: remove a stale socket left by a daemon that died.

    Raises:
        ConfigError: another live daemon listens there, or something that is not a socket is there.
    """
    if not (path.exists() or path.is_symlink()):
        return
    if not path.is_socket():
        raise ConfigError(f"admin socket path {path} exists and is not a socket; remove it or set --admin-socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # stale: nobody listens
        log.info("admin: removed the stale socket %s", path)
        return
    except OSError:  # e.g. a timeout: something is there; do not take it over
        pass
    finally:
        probe.close()
    raise ConfigError(f"admin socket {path} is in use by another running daemon; stop it or set --admin-socket")
