"""A connection's receive deadline with one loop timer a connection, not one a message.

`asyncio.timeout` around every receive arms a loop timer and cancels it when the message comes:
in a front end at a thousand streams of 100-ms messages, ten thousand timers a second, each a
heap entry the loop keeps until it pops it. A `ReceiveDeadline` only records each receive's
deadline; its one timer, when it comes due, cuts the receive waiting if that receive's deadline
has passed and otherwise waits for that deadline. A connection's deadlines only move later (its
idle timeout from the last message, capped by its session's end), so the timer fires about once
an idle timeout, however many messages came meanwhile.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class ReceiveDeadline:
    """Receives, one at a time, each cut when its deadline passes or by `cut`."""

    def __init__(self) -> None:
        self._task: asyncio.Task[object] | None = None  # the task receiving now
        self._deadline = 0.0  # loop time the receive waiting now must end by
        self._timer: asyncio.TimerHandle | None = None
        self._cut = False  # the receive waiting now was cancelled by `cut`

    async def receive(self, recv: Callable[[], Awaitable[T]], deadline: float) -> T:
        """`await recv()` until loop time `deadline`.

        Raises:
            TimeoutError: the deadline passed (or had passed), or `cut` ended the receive.
        """
        loop = asyncio.get_running_loop()
        if deadline <= loop.time():
            raise TimeoutError
        task = asyncio.current_task()
        assert task is not None and self._task is None, "one receive at a time"
        if self._timer is None or deadline < self._timer.when():
            self._arm(loop, deadline)
        self._task, self._deadline, self._cut = task, deadline, False
        cancelling = task.cancelling()
        try:
            got = await recv()
        except asyncio.CancelledError:
            if self._cut and task.uncancel() <= cancelling:
                raise TimeoutError from None
            raise  # cancelled from outside as well: the cancellation wins
        finally:
            self._task = None
        if self._cut:  # cut as the message came: the cancellation found nothing to cancel
            task.uncancel()
        return got

    def cut(self) -> None:
        """End the receive waiting now: it raises TimeoutError (none waiting: nothing)."""
        if self._task is not None and not self._cut:
            self._cut = True
            self._task.cancel()

    def close(self) -> None:
        """Stop the timer (the connection has ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._due)

    def _due(self) -> None:
        """The timer: cut the receive waiting if its deadline has come, else wait for it."""
        assert self._timer is not None
        due, self._timer = self._timer.when(), None
        if self._task is None:
            return  # no receive waiting: the next one arms the timer
        if self._deadline <= due:
            self.cut()
        else:
            self._arm(asyncio.get_running_loop(), self._deadline)
