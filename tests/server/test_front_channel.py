"""A front end's side of the channel (`RemoteEngine`): its event loop reads and writes the socket
itself, without blocking and without threads (threads beside a busy loop wait for the GIL at every
system call: benchmarks/cpu-2026-12-07l-convoy)."""
from __future__ import annotations

import asyncio
import threading

import numpy as np

from streamd.engine.types import EngineSession, StepResults
from streamd.errors import StreamFailed
from streamd.server.audio_pipe import AudioPipe
from streamd.server.channel import BlockingEnd, NonBlockingEnd, socket_pair
from streamd.server.link import CloseStream, Results, Shutdown
from streamd.server.metrics import Metrics
from streamd.server.worker import RemoteEngine


class _State:
    def __init__(self) -> None:
        self.metrics = Metrics(process=False)
        self.shutdown = asyncio.Event()


def test_the_event_loop_writes_what_the_socket_cannot_take_at_once_then_reads_and_dispatches() -> None:
    ours, theirs = socket_pair()
    peer = BlockingEnd(theirs)

    async def main() -> None:
        remote = RemoteEngine(NonBlockingEnd(ours), AudioPipe.create(4096), None)  # type: ignore[arg-type]
        state = _State()
        before = set(threading.enumerate())
        remote.start(state)  # type: ignore[arg-type]
        assert set(threading.enumerate()) == before  # no channel threads
        big = CloseStream(1), np.arange(6 << 20, dtype=np.float32)  # 24 MB: more than the socket's buffers
        remote.post(big)  # type: ignore[arg-type]
        await asyncio.sleep(0.05)  # COALESCE_S: flushed, part of it still waits for room
        assert remote.channel.wants_write
        got = await asyncio.to_thread(peer.recv)  # the loop writes the rest as the peer reads
        assert got[0][0] == CloseStream(1) and np.array_equal(got[0][1], big[1])
        assert not remote.channel.wants_write
        session = EngineSession(id=5)
        remote._sessions[5] = session
        one = np.array([[7, 0]])
        peer.send([Results(np.array([5]), StepResults(one, one, np.array([1]), np.array([0]), np.array([2])))])
        item = await asyncio.wait_for(session.results.get(), 5)
        assert item.tokens == [7] and item.frame_end == 2  # type: ignore[union-attr]
        peer.send([Shutdown()])
        await asyncio.wait_for(state.shutdown.wait(), 5)
        state.shutdown.clear()
        peer.sock.close()  # the engine's process is gone: the streams fail, the front end shuts down
        failed = await asyncio.wait_for(session.results.get(), 5)
        assert isinstance(failed, StreamFailed)
        await asyncio.wait_for(state.shutdown.wait(), 5)
        remote.stop()  # nothing to write to a channel that is gone
    asyncio.run(main())
