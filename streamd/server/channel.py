"""Pickled messages in length-prefixed frames over a Unix socket pair: how the engine's process
and a front-end process talk (`server/frontends.py`, `server/worker.py`).

Frame: an 8-byte big-endian payload length, then a pickle (numpy arrays travel in-band). The
engine's end (`NonBlockingEnd`) never blocks: the engine thread reads and writes it between
steps, so no other thread of the engine's process competes with the engine for the GIL. The
front end's end (`BlockingEnd`) is served by one reader and one writer thread there.
"""
from __future__ import annotations

import pickle
import socket
import struct
from collections import deque
from typing import Any

HEADER = struct.Struct("!Q")
SOCKET_BUFFER_BYTES = 4 << 20  # asked of the kernel for each direction (it may give less)
READ_CHUNK_BYTES = 1 << 20
READ_BUDGET_BYTES = 32 << 20  # most bytes one `read` takes: a fast writer cannot hold the engine


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(the engine's end, the front end's end), with large kernel buffers."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for s in (ours, theirs):
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            s.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
    return ours, theirs


def _frame(obj: Any) -> bytes:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


class BlockingEnd:
    """A blocking end: `send` from one thread, `recv` from one other thread."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self.sock = sock

    def send(self, obj: Any) -> None:
        """Raises OSError when the other end is gone."""
        self.sock.sendall(_frame(obj))

    def recv(self) -> Any:
        """The next message; raises EOFError when the other end closed."""
        (n,) = HEADER.unpack(self._exactly(HEADER.size))
        return pickle.loads(self._exactly(n))

    def _exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise EOFError("channel closed")
            got += k
        return buf

    def close(self) -> None:
        self.sock.close()


class NonBlockingEnd:
    """A non-blocking end for one thread that polls it (`fileno` for a selector): `read` takes
    what has arrived, `send` queues and writes what the socket takes, `flush` writes more."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._in = bytearray()
        self._chunk = bytearray(READ_CHUNK_BYTES)
        self._out: deque[memoryview] = deque()
        self.broken = False  # a write failed: the other end is gone (`read` then sees EOF)

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> tuple[list[Any], bool]:
        """(the complete messages that arrived, whether the other end closed)."""
        eof, taken = False, 0
        while taken < READ_BUDGET_BYTES:
            try:
                k = self.sock.recv_into(self._chunk)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                eof = True
                break
            if k == 0:
                eof = True
                break
            self._in += memoryview(self._chunk)[:k]
            taken += k
        return self._messages(), eof

    def _messages(self) -> list[Any]:
        out, at, buf = [], 0, self._in
        while len(buf) - at >= HEADER.size:
            (n,) = HEADER.unpack_from(buf, at)
            end = at + HEADER.size + n
            if len(buf) < end:
                break
            with memoryview(buf)[at + HEADER.size:end] as frame:
                out.append(pickle.loads(frame))
            at = end
        if at:
            del buf[:at]
        return out

    def send(self, obj: Any) -> None:
        if not self.broken:
            self._out.append(memoryview(_frame(obj)))
            self.flush()

    @property
    def wants_write(self) -> bool:
        """Something is queued that the socket did not take yet."""
        return bool(self._out)

    def flush(self) -> None:
        """Write what the socket takes now."""
        while self._out:
            head = self._out[0]
            try:
                k = self.sock.send(head)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.broken = True
                self._out.clear()
                return
            if k == len(head):
                self._out.popleft()
            else:
                self._out[0] = head[k:]

    def close(self) -> None:
        self.sock.close()
