"""`streamd admin status|migrate|drain|undrain`: talk to a running daemon's admin API."""
from __future__ import annotations

import http.client
import json
import os
import socket
import stat
from pathlib import Path
from typing import Any


class AdminError(RuntimeError):
    """The admin request could not be made or was refused."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def check_socket(path: Path) -> None:
    """Refuse a socket that others could have planted or could use: it must be a socket owned
    by us (or root) and not accessible to group or others."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        raise AdminError(f"no admin socket at {path} (is streamd running? see --socket)") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise AdminError(f"{path} is not a socket")
    if st.st_uid not in (0, os.getuid()):
        raise AdminError(f"refusing {path}: owned by uid {st.st_uid}, not by you or root")
    if st.st_mode & 0o077:
        raise AdminError(f"refusing {path}: permissions {stat.filemode(st.st_mode)} let others in (want srw-------)")


def request(method: str, path: str, body: dict[str, Any] | None = None, *, socket_path: Path | None = None,
            url: str | None = None, token: str | None = None, timeout: float = 120.0) -> tuple[int, dict[str, Any]]:
    """One admin call over the Unix socket, or over TCP (`url` = http://host:port) with a token."""
    if url is not None:
        host = url.removeprefix("http://").rstrip("/")
        conn: http.client.HTTPConnection = http.client.HTTPConnection(host, timeout=timeout)
    elif socket_path is not None:
        check_socket(socket_path)
        conn = _UnixConnection(str(socket_path), timeout)
    else:
        raise AdminError("give --socket or --url")
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
        raise AdminError(f"admin request failed: {e}") from e
    finally:
        conn.close()


def run(command: str, args: Any) -> int:
    """Run one admin command from parsed CLI args; prints JSON (--json) or a summary."""
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    where = dict(socket_path=Path(args.socket) if args.socket else None, url=args.url, token=token)
    if command == "status":
        status, body = request("GET", "/v1/status", **where)
    elif command == "drain":
        status, body = request("POST", "/v1/drain", {"handoff": args.handoff, "exit": args.exit}, **where)
    elif command == "undrain":
        status, body = request("POST", "/v1/undrain", {}, **where)
    else:
        status, body = request("POST", "/v1/migrate", {"device": args.device, "dtype": args.dtype}, **where)
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        print(_summary(command, body))
    return 0 if status == 200 and body.get("ok") else 1


def _summary(command: str, body: dict[str, Any]) -> str:
    if not body.get("ok") and "migration" not in body:
        return f"error: {body.get('error', 'request failed')}"
    admitting = (("draining: no new streams" + (", exits when the last one ends" if body.get("exit_when_drained")
                                                else "; `streamd admin undrain` takes them again"))
                 if body["draining"] else f"admitting {body['admission_limit']}")
    estimate, attention = body.get("capacity_estimate"), body.get("attention")
    line = (f"{body['model']} on {body['device']} {body['dtype']}: {body['streams']}/{body['capacity']} streams "
            f"({admitting}{f'; real-time estimate {estimate}' if estimate is not None else ''}), "
            f"{body.get('chunk_ms')} ms chunks, encoder {body.get('encoder')}"
            f"{f' (attention: {attention})' if attention else ''}, decoder {body['decoder']}")
    if body.get("stalled"):
        line += ("\nENGINE STALLED: streams wait and no step was made for a minute (the log says where the "
                 "engine thread is); /livez and /readyz answer 503: restart the daemon")
    if body.get("handed_off"):
        line += (f"\nhanded off {body['handed_off']} streams: their clients resume them only where another daemon "
                 "answers at the address they use (e.g. behind a load balancer); this one takes none while it drains")
    mig = body.get("migration") if command == "migrate" else body.get("last_migration")
    if mig:
        line += f"\nmigration {mig['source']} -> {mig['target']}: {_migration_result(mig)}"
    return line


def _migration_result(mig: dict[str, Any]) -> str:
    """A migration report (`MigrationReport.as_dict()`) in a few words: what clients noticed and
    what the move cost."""
    if not mig["ok"]:
        return f"FAILED: {mig['error']}"
    if not mig.get("moved", True):
        return "already there, nothing done"
    gap = mig.get("serving_gap_ms")
    said = f"ok, paused {mig['pause_ms']:.1f} ms" + (f", serving gap {gap:.0f} ms" if gap is not None else "")
    prepared = f"prepared in {mig.get('prepare_ms', 0.0) / 1000:.1f} s"
    if mig.get("graphs"):
        prepared += f" ({mig['graphs']} graphs captured"
        deferred = mig.get("graphs_deferred") or 0
        prepared += f", {deferred} batch sizes left to their first step)" if deferred else ")"
    failed = mig.get("streams_failed") or 0
    return f"{said}; {prepared}" + (f"; {failed} streams ended by failed steps" if failed else "")
