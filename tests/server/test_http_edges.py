"""Plain HTTP on the streaming port, as a prober sends it: other methods, HEAD, pipelined
requests, oversized heads. Each gets a proper answer, and the log has no ERROR for them."""
from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest
import websockets

from daemon import config, running


def raw(port: int, data: bytes) -> bytes:
    """Send `data`, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        reply = b""
        try:
            while chunk := s.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass
    return reply


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply else 0


def request(method: str, path: str, headers: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode()


def test_http_edge_cases_get_proper_answers(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with running(config()) as (app, url):
            port = int(url.rsplit(":", 1)[1])

            def probe() -> None:
                for method in ("POST", "PUT", "DELETE", "OPTIONS", "TRACE"):
                    for path in ("/metrics", "/livez", "/v1/stream"):
                        reply = raw(port, request(method, path, "Content-Length: 2\r\n") + b"{}")
                        assert status_of(reply) == 405, (method, path, reply[:80])
                        assert b"\r\nAllow: GET, HEAD\r\n" in reply
                get = raw(port, request("GET", "/metrics"))
                head = raw(port, request("HEAD", "/metrics"))
                assert status_of(get) == status_of(head) == 200
                get_head, _, body = get.partition(b"\r\n\r\n")
                assert b"streamd_streams_active" in body
                assert head.endswith(b"\r\n\r\n") and b"Content-Length: " in head  # no body
                assert status_of(raw(port, request("HEAD", "/livez"))) == 200
                # two pipelined requests in one packet: the first is answered, then the connection closes
                twice = raw(port, request("GET", "/livez") * 2)
                assert status_of(twice) == 200 and twice.count(b"HTTP/1.1 ") == 1
                assert b"Connection: close" in twice
                # a 1 MB head (125 headers of 8000 bytes) is refused; a normal one is not
                big = "".join(f"X-{i}: {'a' * 8000}\r\n" for i in range(125))
                assert status_of(raw(port, request("GET", "/livez", big))) == 431
                normal = "".join(f"X-{i}: {'a' * 400}\r\n" for i in range(20))
                assert status_of(raw(port, request("GET", "/livez", normal))) == 200
                assert status_of(raw(port, b"NOT HTTP AT ALL\r\n\r\n")) == 405

            await asyncio.to_thread(probe)
            # streams still work through the guarded connection
            async with websockets.connect(url + "/v1/stream") as ws:
                await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"}))
                assert json.loads(await ws.recv())["type"] == "ready"
                await ws.send(b"\0\0" * 16000)
                await ws.send(json.dumps({"type": "stop"}))
                kinds = [json.loads(m)["type"] async for m in ws]
                assert kinds[-1] == "summary"

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
