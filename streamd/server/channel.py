"""Pickled messages in length-prefixed frames over a Unix socket pair: how the engine's process
and a front-end process talk (`server/frontends.py`, `server/worker.py`).

Frame: a 16-byte header (body length, number k of out-of-band buffers; big-endian), then the
body: k buffer lengths (8 bytes each), the pickle (protocol 5), the k buffers. Numpy arrays
travel out of band, so a receiver's arrays are views of the frame it read: audio is copied
once, by the kernel. The engine's end (`NonBlockingEnd`) never blocks: the engine thread reads
and writes it between steps, so no other thread of the engine's process competes with the
engine for the GIL. The front end's end (`BlockingEnd`) is served by one reader and one writer
thread there.
"""
from __future__ import annotations

import pickle
import socket
import struct
from collections import deque
from typing import Any

HEADER = struct.Struct("!QQ")
LENGTH = struct.Struct("!Q")
SOCKET_BUFFER_BYTES = 4 << 20  # asked of the kernel for each direction (it may give less)
READ_BUDGET_BYTES = 32 << 20  # most bytes one `read` takes: a fast writer cannot hold the engine


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(the engine's end, the front end's end), with large kernel buffers."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for s in (ours, theirs):
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            s.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
    return ours, theirs


def _frame(obj: Any) -> list[memoryview]:
    """The frame of `obj`: the header and body parts, in order."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    sizes = b"".join(LENGTH.pack(r.nbytes) for r in raws)
    body = len(sizes) + len(payload) + sum(r.nbytes for r in raws)
    return [memoryview(HEADER.pack(body, len(raws)) + sizes + payload), *raws]


def _load(body: bytearray, k: int) -> Any:
    """The message of a frame's body with k out-of-band buffers (views of `body`)."""
    view = memoryview(body)
    sizes = [LENGTH.unpack_from(body, LENGTH.size * i)[0] for i in range(k)]
    at = LENGTH.size * k
    end = len(body) - sum(sizes)
    buffers = []
    for n in sizes:
        buffers.append(view[end:end + n])
        end += n
    return pickle.loads(view[at:len(body) - sum(sizes)], buffers=buffers)


class BlockingEnd:
    """A blocking end: `send` from one thread, `recv` from one other thread."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self.sock = sock

    def send(self, obj: Any) -> None:
        """Raises OSError when the other end is gone."""
        for part in _frame(obj):
            self.sock.sendall(part)

    def recv(self) -> Any:
        """The next message; raises EOFError when the other end closed."""
        body, k = HEADER.unpack(self._exactly(HEADER.size))
        return _load(self._exactly(body), k)

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
        self._header = bytearray(HEADER.size)
        self._body: bytearray | None = None  # the frame being read, once its header is in
        self._k = 0
        self._got = 0  # bytes of the header (no body yet) or of the body read so far
        self._out: deque[memoryview] = deque()
        self.broken = False  # a write failed: the other end is gone (`read` then sees EOF)

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> tuple[list[Any], bool]:
        """(the complete messages that arrived, whether the other end closed). Each frame's
        body is read into its own buffer, which the message's arrays then view."""
        out: list[Any] = []
        taken = 0
        while taken < READ_BUDGET_BYTES:
            target = self._header if self._body is None else self._body
            try:
                k = self.sock.recv_into(memoryview(target)[self._got:])
            except (BlockingIOError, InterruptedError):
                return out, False
            except OSError:
                return out, True
            if k == 0:
                return out, True
            taken += k
            self._got += k
            if self._got < len(target):
                continue
            if self._body is None:
                size, self._k = HEADER.unpack(self._header)
                self._body, self._got = bytearray(size), 0
                if size:
                    continue
            out.append(_load(self._body, self._k))
            self._body, self._got = None, 0
        return out, False

    def send(self, obj: Any) -> None:
        if not self.broken:
            self._out.extend(_frame(obj))
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
