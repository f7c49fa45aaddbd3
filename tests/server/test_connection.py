"""A connection and its face (`server/handler.py`): what `Connection` does with any `Face`,
without a socket or an engine: results go through the face's `deliver` then `delivered`, an error
that ends the stream is reported by the face before the close frame, and a slow consumer gets the
close frame only."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from websockets.protocol import State

from helpers import fixture_model
from streamd import protocol as p
from streamd.config import Config
from streamd.engine.types import ChunkGeometry
from streamd.errors import IdleTimeout, SlowConsumer, StreamdError
from streamd.server.context import StreamContext
from streamd.server.handler import Connection, can_send_at_once
from streamd.server.metrics import Metrics
from streamd.session.core import Result

TOK = fixture_model("rnnt").tokenizer


class Socket:
    """The websocket a connection sees: what it sends and how it was closed."""

    def __init__(self) -> None:
        self.remote_address, self.request = None, None
        self.state, self.transport = State.OPEN, Buffered(0, 65536)  # open, nothing waiting to be written
        self.sent: list[str] = []
        self.closed: tuple[int, str] | None = None

    async def send(self, text: str) -> None:
        self.sent.append(text)

    async def close(self, code: int, reason: str = "") -> None:
        self.closed = (code, reason)


class Face:
    """A face that records what its connection asks of it; `serve` raises `error` if given."""

    def __init__(self, conn: Connection, error: StreamdError | None = None) -> None:
        self.conn, self.error = conn, error
        self.calls: list[Any] = []

    async def serve(self) -> str:
        if self.error is not None:
            raise self.error
        return "done"

    async def deliver(self, result: Result) -> None:
        self.calls.append(result)
        await self.conn.send_text(result.text)

    async def delivered(self) -> None:
        self.calls.append("delivered")

    async def report(self, error: StreamdError) -> None:
        self.calls.append(error)
        await self.conn.send_text("reported " + error.code)


def connection(error: StreamdError | None = None) -> tuple[Connection, Face, Socket]:
    engine: Any = SimpleNamespace(status=SimpleNamespace(device="cpu", dtype="fp32",
                                                         geometry=ChunkGeometry(1, 8, 160, 16000)))
    state = StreamContext(Config(), engine, TOK, Metrics(process=False), "test-model")
    ws = Socket()
    conn = Connection(ws, state, lambda c: Face(c, error))  # type: ignore[arg-type]
    assert isinstance(conn.face, Face)
    return conn, conn.face, ws


def test_results_go_through_the_face_then_delivered() -> None:
    async def main() -> tuple[Face, Socket]:
        conn, face, ws = connection()
        await conn.deliver_all([])  # a hand-over without results still ends with `delivered`
        await conn.deliver_all([p.Partial(0, "a", 0.0, 0.5, 0.6), p.Final(0, "a b", 0.0, 0.9, 1.0, "endpoint")])
        return face, ws

    face, ws = asyncio.run(main())
    assert [c if isinstance(c, str) else c.text for c in face.calls] == ["delivered", "a", "a b", "delivered"]
    assert ws.sent == ["a", "a b"]


@pytest.mark.parametrize("error", [IdleTimeout("no message for 1 s"), SlowConsumer("results not read")])
def test_an_error_is_reported_by_the_face_then_closes(error: StreamdError) -> None:
    async def main() -> tuple[Face, Socket]:
        conn, face, ws = connection(error)
        await conn.run()
        return face, ws

    face, ws = asyncio.run(main())
    assert ws.closed == p.close_for(error)
    if isinstance(error, SlowConsumer):  # not reading: the close frame is all it may see
        assert face.calls == [] and ws.sent == []
    else:
        assert face.calls == [error] and ws.sent == ["reported " + error.code]


class Buffered:
    """A transport's write buffer: `size` bytes in it, high-water mark `high`."""

    def __init__(self, size: int, high: int) -> None:
        self.size, self.high = size, high

    def get_write_buffer_size(self) -> int:
        return self.size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.high // 4, self.high


def test_a_send_goes_without_a_timer_only_when_it_cannot_wait() -> None:
    """`send_text` skips its send timeout only where websockets' send cannot wait: the connection
    open and the frame (counted at 4 bytes a character) fitting under the high-water mark; a slow
    client's full buffer or a closing connection gets the timeout (tests/server/test_hostile.py:
    the client that never reads is closed)."""
    ws: Any = SimpleNamespace(state=State.OPEN, transport=Buffered(0, 65536))
    assert can_send_at_once(ws, "x" * 300)
    ws.transport.size = 65536 - 4 * 300 - 14
    assert not can_send_at_once(ws, "x" * 300)
    assert can_send_at_once(ws, "x" * 299)
    ws.transport.size = 0
    for state in (State.CLOSING, State.CLOSED):
        ws.state = state
        assert not can_send_at_once(ws, "x")
