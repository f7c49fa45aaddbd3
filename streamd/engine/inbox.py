"""How other threads reach the engine thread: the commands they post (`Command`), the inbox that
holds them, the socket pair whose byte wakes the engine thread when it sleeps, and the selector it
sleeps in, which also serves the `IoSource`s (front ends' channels) between steps.

Stream commands (`Open`, `Audio`, `End`, `Close`) and the named jobs that do not touch the
recognizer (`Send`, `Watch`, `Unwatch`) are applied at the engine thread's next turn, also while a
step is in flight; `Call` (recognizer work: warm-up, probes, a migration's cut-over) and `Stop`
wait until no step is in flight (`Engine`).
"""
from __future__ import annotations

import selectors
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from streamd.engine.types import EngineSession

if TYPE_CHECKING:
    from streamd.engine.recognizer import Recognizer


class IoSource(Protocol):
    """A non-blocking socket the engine thread serves between steps. `readable` and `writable`
    run on the engine thread when the selector says so; `wants_write` asks for `writable`."""

    def fileno(self) -> int: ...

    def readable(self) -> None: ...

    def writable(self) -> None: ...

    @property
    def wants_write(self) -> bool: ...

    def close(self) -> None: ...


class Outlet(Protocol):
    """Where `Send` hands messages on the engine thread (a front end's channel)."""

    def send(self, messages: list[Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class Audio:
    """Queue float32 mono samples at the model rate for `session`."""

    session: EngineSession
    samples: np.ndarray


@dataclass(frozen=True, slots=True)
class End:
    """No more audio for `session`: flush what is left."""

    session: EngineSession


@dataclass(frozen=True, slots=True)
class Close:
    """Release `session`'s slot now; its pending audio is dropped."""

    session: EngineSession


@dataclass(frozen=True, slots=True)
class Open:
    """Give `session` a slot; `future` gets None, or the CapacityError when none is free."""

    session: EngineSession
    future: Future[None]


@dataclass(frozen=True, slots=True)
class Call:
    """Run `fn(recognizer)` on the engine thread between two steps; its result goes to `future`."""

    fn: Callable[[Recognizer], Any]
    future: Future[Any]


@dataclass(frozen=True, slots=True)
class Send:
    """Hand `messages` to `outlet` (a status, a /metrics text, a handoff for a front end)."""

    outlet: Outlet
    messages: list[Any]


@dataclass(frozen=True, slots=True)
class Watch:
    """Serve `source` from now on."""

    source: IoSource


@dataclass(frozen=True, slots=True)
class Unwatch:
    """Stop serving `sources` and close them; then `done` gets None."""

    sources: list[IoSource]
    done: Future[None]


@dataclass(frozen=True, slots=True)
class Stop:
    """Finish the engine thread (slots released)."""


Command = Open | Audio | End | Close | Call | Send | Watch | Unwatch | Stop
StreamCommand = Audio | End | Close  # a stream's commands (a front end's bridge posts its End and Close in bulk)
HELD = (Call, Stop)  # the commands that wait until no step is in flight


class Inbox:
    """Commands posted from any thread (`post`), taken in order on the engine thread (`take`);
    `wait` sleeps there until one comes or a source is ready, serving the sources."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: deque[Command] = deque()
        self._sleeping = False  # the engine thread waits in `select` (guarded by `_lock`)
        self._wake_r, self._wake_w = socket.socketpair()
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._sources: dict[IoSource, int] = {}  # source -> the selector events it is registered for

    # -- any thread ------------------------------------------------------------------------------
    def post(self, command: Command) -> None:
        self.post_many((command,))

    def post_many(self, commands: Iterable[Command]) -> None:
        """Queue commands in order; wakes the engine thread if it sleeps."""
        with self._lock:
            self._items.extend(commands)
            wake, self._sleeping = self._sleeping, False
        if wake:
            try:
                self._wake_w.send(b"\0")
            except BlockingIOError:  # the buffer is full of wake-ups already
                pass

    # -- engine thread ---------------------------------------------------------------------------
    def take(self) -> deque[Command]:
        """Everything posted so far, in order."""
        with self._lock:
            items, self._items = self._items, deque()
        return items

    def put_back(self, held: deque[Command]) -> None:
        """Commands taken and held: they go first, before everything posted since."""
        with self._lock:
            held.extend(self._items)
            self._items = held

    def wait(self, timeout: float | None) -> None:
        """Serve the sources; when nothing is posted, first sleep until something is or a source
        is ready, at most `timeout` seconds (None: no limit, 0: do not sleep)."""
        with self._lock:
            sleep = timeout != 0 and not self._items
            self._sleeping = sleep
        self.serve(timeout if sleep else 0)
        if sleep:
            with self._lock:
                self._sleeping = False

    def serve(self, timeout: float | None) -> None:
        """Wait for the selector (at most `timeout` s) and let the sources read and write; a post
        does not end this wait (the engine thread polls a step this way)."""
        for key, mask in self._selector.select(timeout):
            source: IoSource | None = key.data
            if source is None:
                self._drain_wake_ups()
            elif source in self._sources:  # an earlier event's handler may have removed it
                if mask & selectors.EVENT_WRITE:
                    source.writable()
                if mask & selectors.EVENT_READ:
                    source.readable()

    def watch(self, source: IoSource) -> None:
        self._sources[source] = selectors.EVENT_READ
        self._selector.register(source, selectors.EVENT_READ, source)
        self.update_interest()

    def unwatch(self, source: IoSource) -> None:
        """Stop serving `source` (idempotent)."""
        if self._sources.pop(source, None) is not None:
            self._selector.unregister(source)

    def update_interest(self) -> None:
        """Ask for `writable` from the sources with queued output, and only from those."""
        for source, events in self._sources.items():
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if source.wants_write else 0)
            if want != events:
                self._sources[source] = want
                self._selector.modify(source, want, source)

    def close(self) -> None:
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _drain_wake_ups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
