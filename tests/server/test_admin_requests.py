"""The admin API against malformed, stalled and unauthorised requests, and its socket path:
every request gets an HTTP answer with a message, and a second daemon never takes over the
socket of a live one."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import struct
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

import streamd.server.admin as admin_mod
from daemon import config, running
from streamd.config import AdminConfig
from streamd.errors import ConfigError
from streamd.server.admin import AdminServer, Control
from streamd.server.app import App, build_state
from streamd.server.metrics import Metrics


def raw(sock: Path, data: bytes, wait: float = 5.0) -> tuple[int, dict[str, Any]]:
    """Send `data` over the admin socket; the HTTP status and JSON body (status 0: no response)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(wait)
        s.connect(str(sock))
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    if not reply:
        return 0, {}
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def post(body: bytes, path: str = "/v1/migrate") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


BAD_BODIES = {
    "list": (b"[1, 2]", "must be a JSON object"),
    "string": (b'"cpu"', "must be a JSON object"),
    "null": (b"null", "must be a JSON object"),
    "not_json": (b"{device: cpu}", "must be a JSON object"),
    "device_list": (b'{"device": ["cpu"]}', '"device" must be a non-empty string, got ["cpu"]'),
    "dtype_number": (b'{"dtype": 5}', '"dtype" must be a non-empty string, got 5'),
    "empty_device": (b'{"device": ""}', '"device" must be a non-empty string'),
    "empty_object": (b"{}", 'give "device", "dtype" or both'),
    "unknown_field": (b'{"devise": "cpu"}', 'unknown field "devise"'),
    "deep": (b"[" * 5000 + b"]" * 5000, "must be a JSON object"),
}


def test_bad_requests_get_400_and_stalled_ones_408(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sock = tmp_path / "admin.sock"
    monkeypatch.setattr(admin_mod, "READ_TIMEOUT_S", 0.5)

    async def main() -> None:
        async with running(config(admin=AdminConfig(socket=sock))) as (app, url):
            for name, (body, words) in BAD_BODIES.items():
                status, reply = await asyncio.to_thread(raw, sock, post(body))
                assert status == 400 and not reply["ok"], name
                assert words in reply["error"], (name, reply)
                assert len(reply["error"]) < 300
            for name, data in {"nothing": b"", "half_head": b"POST /v1/migrate HTTP/1.1\r\nHost",
                               "short_body": post(b'{"dtype": "bf16"}')[:-3]}.items():
                status, reply = await asyncio.to_thread(raw, sock, data)
                assert status == 408 and "not complete" in reply["error"], name
            status, reply = await asyncio.to_thread(raw, sock, b"GARBAGE\r\n\r\n")
            assert status == 400 and "not an HTTP request line" in reply["error"]
            status, reply = await asyncio.to_thread(raw, sock, post(b"{}").replace(b"Content-Length: 2", b"Content-Length: -1"))
            assert status == 400 and "Content-Length" in reply["error"]

            # an index on the cpu is not silently ignored; a move to where the model is does nothing
            status, reply = await asyncio.to_thread(raw, sock, post(b'{"device": "cpu:1"}'))
            assert status == 409 and "unknown device 'cpu:1'; use auto, cpu or cuda:N" in reply["migration"]["error"]
            status, reply = await asyncio.to_thread(raw, sock, post(b'{"device": "cpu", "dtype": "fp32"}'))
            assert status == 200 and reply["ok"] and reply["migration"]["moved"] is False
            assert reply["migration"]["pause_ms"] == 0.0
            metrics = app.state.metrics.render().decode()
            assert 'streamd_migrations_total{result="ok"} 0.0' in metrics
            # the daemon still answers and serves
            status, reply = await asyncio.to_thread(raw, sock, b"GET /v1/status HTTP/1.1\r\n\r\n")
            assert status == 200 and reply["device"] == "cpu"

    asyncio.run(main())


NO_TOKEN = "unauthorised: no bearer token (give the admin token file with --token-file)"


def test_tcp_admin_needs_the_bearer_scheme_and_warns_on_a_readable_token(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    os.chmod(token, 0o644)

    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = config(admin=AdminConfig(socket=None, port=port, token_file=token))
        async with running(cfg):
            def get(auth: str) -> tuple[int, str]:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(f"GET /v1/status HTTP/1.1\r\nAuthorization: {auth}\r\n\r\n".encode())
                    head, _, body = s.recv(65536).partition(b"\r\n\r\n")
                    return int(head.split()[1]), json.loads(body).get("error", "")
            assert await asyncio.to_thread(get, "s3cret-token") == (401, NO_TOKEN)  # the bare token, no scheme
            assert await asyncio.to_thread(get, "Basic s3cret-token") == (401, NO_TOKEN)
            assert await asyncio.to_thread(get, "Bearer wr0ng-token") == (401, "unauthorised: wrong bearer token")
            assert (await asyncio.to_thread(get, "Bearer s3cret-token"))[0] == 200
            assert (await asyncio.to_thread(get, "bearer s3cret-token"))[0] == 200  # schemes are case-insensitive

    with caplog.at_level(logging.WARNING, logger="streamd.server"):
        asyncio.run(main())
    assert any("admin token file" in r.getMessage() and "every user" in r.getMessage() for r in caplog.records)
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("admin: refused")]
    assert [m.rsplit(": ", 1)[1] for m in refused] == [
        NO_TOKEN.split(": ", 1)[1]] * 2 + ["wrong bearer token"], refused
    assert all("GET /v1/status over tcp from ('127.0.0.1', " in m for m in refused), refused
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "s3cret" not in logged and "wr0ng" not in logged


def test_a_second_daemon_does_not_take_over_a_live_admin_socket(tmp_path: Path) -> None:
    sock = tmp_path / "admin.sock"

    async def main() -> None:
        async with running(config(admin=AdminConfig(socket=sock))) as (app, url):
            second = AdminServer(Control(app.state), AdminConfig(socket=sock))
            with pytest.raises(ConfigError, match="in use by another running daemon"):
                await second.start()
            await second.stop()  # removes nothing that is not its own
            status, reply = await asyncio.to_thread(raw, sock, b"GET /v1/status HTTP/1.1\r\n\r\n")
            assert status == 200 and reply["ok"]
        assert not sock.exists()  # the first daemon removes its own socket on exit

    asyncio.run(main())


def test_a_stale_socket_is_replaced_and_a_regular_file_refused(tmp_path: Path) -> None:
    sock = tmp_path / "admin.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))  # a daemon that died without removing its socket
    stale.close()

    async def main() -> None:
        async with running(config(admin=AdminConfig(socket=sock))):
            status, _ = await asyncio.to_thread(raw, sock, b"GET /v1/status HTTP/1.1\r\n\r\n")
            assert status == 200

    asyncio.run(main())
    sock.write_text("not a socket")
    app = App(build_state(config(admin=AdminConfig(socket=sock)), Metrics(process=False)))
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        asyncio.run(app.serve())
    assert sock.read_text() == "not a socket"


def test_admin_clients_that_reset_their_connection_log_no_traceback(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Over TCP and the Unix socket, before and after the request is complete."""
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    os.chmod(token, 0o600)
    sock = tmp_path / "admin.sock"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    request = b"POST /v1/drain HTTP/1.1\r\nAuthorization: Bearer s3cret-token\r\nContent-Length: 2\r\n\r\n{}"

    def reset(family: socket.AddressFamily, address: Any, data: bytes) -> None:
        with socket.socket(family) as s:
            s.connect(address)
            if family == socket.AF_INET:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
            s.sendall(data)

    async def main() -> None:
        async with running(config(admin=AdminConfig(socket=sock, port=port, token_file=token))):
            for i in range(20):
                for family, address in ((socket.AF_INET, ("127.0.0.1", port)), (socket.AF_UNIX, str(sock))):
                    await asyncio.to_thread(reset, family, address, request if i % 2 else request[:30])
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)
            assert await asyncio.to_thread(raw, sock, post(b"", "/v1/status").replace(b"POST", b"GET")) == (200, ANY)

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors[:3]]
