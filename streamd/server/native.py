"""The native protocol on ``/v1/stream`` (`streamd.protocol`, ``docs/protocol.md``): the face of a
`Connection` (`server/handler.py`) that speaks it.

The first message is ``start`` (or a resume of a parked stream: the connection then only carries
it, `server/resume.py`); ``ready`` answers it; audio and controls go to the session until ``stop``
or shutdown; the session's results are sent as they are, and a ``summary`` before the close.
Resumable streams record what they send, for a replay.
"""
from __future__ import annotations

import asyncio
import logging
import time

from websockets.exceptions import ConnectionClosed

from streamd.errors import StreamdError
from streamd import protocol as p
from streamd.server.handler import Connection
from streamd.server.resume import Attach, carry
from streamd.session.core import Result

log = logging.getLogger("streamd.server")


class NativeStream:
    """The native face of a connection (`handler.Face`)."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.session = conn, conn.session

    async def serve(self) -> str:
        conn, state, cfg = self.conn, self.conn.state, self.conn.state.config.server
        first = await conn.recv(cfg.idle_timeout_s)
        if first is None:  # shutting down before "start": nothing to drain
            await conn.ws.close(p.CloseCode.GOING_AWAY)
            return "shutdown"
        msg = self.session.receive(first)  # raises unless it is "start"
        assert isinstance(msg, p.Start)
        if msg.resume is not None:
            attach, result = state.sessions.resume(msg.resume.session_id, msg.resume.secret, conn.ws,
                                                   msg.resume.last_seq)
            state.metrics.resumes.labels(result=result).inc()
            if result == "refused":
                log.warning("connection %s: a resume without the session's secret was refused", conn.log_id)
            if attach is not None:
                return await self._carry(attach)  # the session's commands are never run
        with conn.serving():
            await conn.run_commands()  # open the first segment
            resumable = conn.parking.enabled = state.sessions.grace_s > 0
            await self.send(p.Ready(conn.id, state.model_name, state.device, state.dtype,
                                    state.chunk_ms, msg.sample_rate, self.session.rules,
                                    cfg.idle_timeout_s, cfg.max_session_s,
                                    resume_secret=conn.parking.state.secret if resumable else None))
            if resumable:
                conn.parking.register()
            sender = conn.start_sender()
            reason = await self._receive_loop()
            if reason == "shutdown":
                self.session.end()
            await conn.run_commands()
            if reason == "stop":
                await self._flush_after_stop(sender)
            else:
                await sender
        await self.send(self.session.summary("shutdown" if reason == "shutdown" else "stop",
                                             time.monotonic() - conn.started))
        await conn.close(p.CloseCode.GOING_AWAY if reason == "shutdown" else p.CloseCode.NORMAL_CLOSURE)
        return reason

    async def _receive_loop(self) -> str:
        """Feed the session audio and controls until `stop` or shutdown; returns which."""
        conn = self.conn
        while True:
            data = await conn.next_message()
            if data is None:
                return "shutdown"
            if isinstance(data, bytes):
                self.session.proto.receive_audio()  # raises unless audio may come now
                conn.parking.state.audio_bytes += len(data)
                fed = await conn.feed(data)
                del data  # taken: the next receive waits without it
                if not fed:
                    return "shutdown"
                continue
            msg = self.session.receive(data)
            await conn.run_commands()
            if isinstance(msg, p.Stop):
                return "stop"
            elif isinstance(msg, p.Finalize):
                conn.parking.state.finalizes += 1

    async def _flush_after_stop(self, sender: asyncio.Task[None]) -> None:
        """Wait for the last results; a client message before they are all sent breaks the protocol."""
        late = asyncio.ensure_future(self.conn.ws.recv())
        await asyncio.wait({sender, late}, return_when=asyncio.FIRST_COMPLETED)
        if not late.done():
            late.cancel()
        else:
            self.session.receive(late.result())  # raises: a message after stop
        await sender

    async def deliver(self, result: Result) -> None:
        """A result goes to the client as it is."""
        await self.send(result)

    async def delivered(self) -> None:
        """Nothing more: the native protocol has no messages of its own between results."""

    async def report(self, error: StreamdError) -> None:
        """An ``error`` message, unless the stream has closed already (after ``stop``)."""
        if self.session.proto.phase is not p.Phase.CLOSED:
            await self.send(p.Error.from_exception(error))

    async def send(self, msg: p.ServerMessage) -> None:
        """Send a message; a resumable stream records it, and keeps it for the replay if the
        connection has dropped."""
        conn = self.conn
        async with conn.send_lock:
            text = self.session.proto.encode(msg)
            if not conn.parking.enabled:
                await conn.send_text(text)
                return
            conn.parking.state.record(self.session.proto.seq - 1, text)
            try:
                await conn.send_text(text)
            except ConnectionClosed:
                pass  # kept for a resume; the receive side notices the drop

    async def _carry(self, attach: Attach) -> str:
        """This connection resumed a parked session, which now uses it (`resume.carry`). It is
        not a stream of its own."""
        state = self.conn.state
        task = asyncio.current_task()
        if task is not None and task in state.live:
            state.live.discard(task)
            state.count_live()
            state.metrics.streams_active.dec()
        return await carry(self.conn, attach)
