"""A front end's audio on its way to the engine's process through shared memory, not the channel.

Through the channel's socket, every sample would be copied three times on its way to a stream's
ring, two of them on the engine thread (the kernel's copy into the frame it reads, measured at
~3 us a 10 KB piece on the development VM, then the ring's memcpy, ~0.5-1.7 us). Through an
`AudioPipe` the front end writes each message's samples into memory both processes map, sends
only where they are (`link.SharedAudio`), and the engine thread copies them once, straight into
the rings, then gives the bytes back (`free`).

The pipe is a one-way ring of bytes: one writer (the front end's event loop, `put`), one reader
(the engine thread, `view` and `free`, in the order the messages were put). A message's samples
are contiguous: one that would wrap around the end starts again at 0 (the bytes skipped are
freed with it). The only counter shared is the reader's `freed` (bytes given back so far, only
growing; 8 aligned bytes, written by the reader alone); the writer knows its own `put` total.
The samples are written before the message that names them leaves through the socket (a system
call), so the reader never sees a message before its bytes.

A front end's queued audio leaves in runs of at most 1/`RUN_SHARE` of the pipe (`runs`): a flush
late by a busy event loop (in benchmarks/h100-2026-12-07g, front ends of ~800 streams woke 0.3-1 s
late: up to 15-50 MB of audio waiting) still goes through the pipe, in several messages. A run
that does not fit (the reader is behind by more than the pipe holds) goes through the channel as
before (`link.StreamAudio`): nothing waits and nothing is lost.
"""
from __future__ import annotations

import mmap
import os
import tempfile
from multiprocessing import reduction
from typing import Any

import numpy as np

PIPE_BYTES = 32 << 20  # per front end: ~0.4 s of 1,200 streams' audio (16 kHz float32)
HEADER_BYTES = 64  # the reader's `freed` counter, alone in its cache line
ALIGN = 64  # every message's samples start on a cache line
RUN_SHARE = 8  # a message's samples are at most 1/RUN_SHARE of the pipe (`runs`)


class AudioPipe:
    """One front end's pipe: made by the engine's process (`create`), handed to the front end
    in its spawn spec (pickling passes the memory's file descriptor to the child)."""

    def __init__(self, fd: int, capacity: int) -> None:
        self.capacity = capacity
        self._fd = fd
        self._map = mmap.mmap(fd, HEADER_BYTES + capacity)
        self._freed = np.frombuffer(self._map, np.int64, count=1)  # bytes the reader gave back
        self._data = np.frombuffer(self._map, np.uint8, count=capacity, offset=HEADER_BYTES)
        self._put = 0  # bytes put so far (the writer's own counter; skips included)

    @classmethod
    def create(cls, capacity: int = PIPE_BYTES) -> AudioPipe:
        """A new pipe in anonymous shared memory (Linux's `memfd_create`: no file system, no size
        limit of /dev/shm; elsewhere an unlinked temporary file)."""
        if capacity % ALIGN:
            raise ValueError(f"capacity must be a multiple of {ALIGN} bytes, not {capacity}")
        try:
            fd = os.memfd_create("streamd-audio", os.MFD_CLOEXEC)
        except (AttributeError, OSError):  # not Linux, or a kernel older than 3.17
            fd, path = tempfile.mkstemp(prefix="streamd-audio-")
            os.unlink(path)
        os.ftruncate(fd, HEADER_BYTES + capacity)
        return cls(fd, capacity)

    def __reduce__(self) -> tuple[Any, ...]:
        # as multiprocessing passes sockets and its own shared memory to a spawned child
        return _attach, (reduction.DupFd(self._fd), self.capacity)

    # -- the writer (front end) ------------------------------------------------------------------
    def put(self, pieces: list[np.ndarray]) -> tuple[int, int] | None:
        """Write the float32 pieces one after the other; returns (byte offset of the first,
        the `end` to `free` once they are taken), or None when they do not fit now."""
        nbytes = 4 * sum(p.size for p in pieces)
        span = -(-nbytes // ALIGN) * ALIGN
        if span > self.capacity // 2:
            return None
        at = self._put % self.capacity
        skip = self.capacity - at if at + span > self.capacity else 0
        if self._put + skip + span - int(self._freed[0]) > self.capacity:
            return None
        at = (at + skip) % self.capacity
        out = self._data[at: at + nbytes].view(np.float32)
        k = 0
        for p in pieces:
            out[k: k + p.size] = p
            k += p.size
        self._put += skip + span
        return at, self._put

    # -- the reader (engine thread) --------------------------------------------------------------
    def view(self, at: int, count: int) -> np.ndarray:
        """(count,) float32: a message's samples where `put` wrote them (valid until `free`)."""
        return np.frombuffer(self._map, np.float32, count=count, offset=HEADER_BYTES + at)

    def free(self, end: int) -> None:
        """The samples of every message up to the one whose `put` returned `end` are taken."""
        self._freed[0] = end

    def close(self) -> None:
        """Close the file descriptor (the mapping goes with the last view of it)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def runs(sizes: list[int], capacity: int) -> list[tuple[int, int]]:
    """Pieces of `sizes` float32 samples, in order, as runs [a, b) of at most 1/`RUN_SHARE` of a
    pipe of `capacity` bytes each (a larger piece: a run of its own), every piece in one run."""
    most = capacity // RUN_SHARE
    out, a, nbytes = [], 0, 0
    for i, n in enumerate(sizes):
        if nbytes and nbytes + 4 * n > most:
            out.append((a, i))
            a, nbytes = i, 0
        nbytes += 4 * n
    if sizes:
        out.append((a, len(sizes)))
    return out


def _attach(fd: Any, capacity: int) -> AudioPipe:
    return AudioPipe(fd.detach(), capacity)
