"""The engine thread's inbox: posts from other threads, the wake-up, the sources it serves."""
from __future__ import annotations

import socket
import threading
import time
from collections import deque
from concurrent.futures import Future

import numpy as np

from streamd.engine.inbox import Audio, Call, End, Inbox, Stop
from streamd.engine.types import EngineSession


class Source:
    """A socket the inbox serves: records what it was asked to do."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock, self.read, self.written, self.closed = sock, b"", 0, False
        self.wants_write = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def readable(self) -> None:
        self.read += self.sock.recv(4096)

    def writable(self) -> None:
        self.written += 1
        self.wants_write = False

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def test_posts_come_out_in_order() -> None:
    inbox = Inbox()
    s = EngineSession()
    samples = np.zeros(4, np.float32)
    inbox.post(Audio(s, samples))
    inbox.post_many([End(s), Stop()])
    assert list(inbox.take()) == [Audio(s, samples), End(s), Stop()]
    assert not inbox.take()
    inbox.close()


def test_a_post_from_another_thread_wakes_a_waiting_inbox() -> None:
    inbox = Inbox()
    poster = threading.Timer(0.2, inbox.post, (Stop(),))
    t0 = time.monotonic()
    poster.start()
    inbox.wait(None)  # sleeps until the post
    waited = time.monotonic() - t0
    assert 0.15 < waited < 5.0
    assert list(inbox.take()) == [Stop()]
    poster.join()
    inbox.close()


def test_wait_sleeps_only_when_nothing_is_posted() -> None:
    inbox = Inbox()
    t0 = time.monotonic()
    inbox.wait(0.2)  # nothing posted: sleeps out its timeout
    assert time.monotonic() - t0 >= 0.15
    inbox.post(Stop())
    t0 = time.monotonic()
    inbox.wait(5.0)  # something posted: returns at once
    inbox.wait(0)
    assert time.monotonic() - t0 < 1.0
    inbox.close()


def test_held_commands_go_back_before_later_posts() -> None:
    inbox = Inbox()
    first = Call(lambda rec: None, Future())
    inbox.post(first)
    held = deque(inbox.take())
    inbox.post(Stop())
    inbox.put_back(held)
    assert list(inbox.take()) == [first, Stop()]
    inbox.close()


def test_sources_are_served_while_watched() -> None:
    inbox = Inbox()
    ours, theirs = socket.socketpair()
    source = Source(ours)
    inbox.watch(source)
    theirs.send(b"hello")
    inbox.wait(2.0)  # the source is ready: the wait ends and it reads
    assert source.read == b"hello"
    source.wants_write = True
    inbox.update_interest()  # now it is asked to write too
    inbox.serve(2.0)
    assert source.written == 1
    inbox.update_interest()
    inbox.unwatch(source)
    inbox.unwatch(source)  # idempotent
    theirs.send(b"more")
    inbox.wait(0.1)
    assert source.read == b"hello"  # no longer served
    theirs.close()
    source.close()
    inbox.close()
