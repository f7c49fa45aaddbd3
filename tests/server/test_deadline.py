"""ReceiveDeadline: each receive ends by its deadline or a cut, with one loop timer a connection."""
from __future__ import annotations

import asyncio

import pytest

from streamd.server.deadline import ReceiveDeadline


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_a_message_before_the_deadline_is_returned_and_a_silence_past_it_times_out() -> None:
    async def main() -> None:
        loop, d, q = asyncio.get_running_loop(), ReceiveDeadline(), asyncio.Queue[int]()
        loop.call_later(0.01, q.put_nowait, 1)
        assert await d.receive(q.get, loop.time() + 1.0) == 1
        started = loop.time()
        with pytest.raises(TimeoutError):
            await d.receive(q.get, loop.time() + 0.05)
        assert 0.04 <= loop.time() - started < 0.5
        d.close()
    run(main())


def test_receives_that_move_the_deadline_later_keep_one_timer_and_each_is_held_to_its_own() -> None:
    async def main() -> None:
        loop, d, q = asyncio.get_running_loop(), ReceiveDeadline(), asyncio.Queue[int]()
        timers = 0
        call_at = loop.call_at

        def counted(when, callback, *args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal timers
            timers += callback == d._due
            return call_at(when, callback, *args, **kwargs)
        loop.call_at = counted  # type: ignore[method-assign]
        for i in range(200):  # messages every 1 ms, a deadline 60 ms after each
            loop.call_soon(q.put_nowait, i)
            assert await d.receive(q.get, loop.time() + 0.06) == i
            await asyncio.sleep(0.001)
        assert 1 <= timers <= 10  # the first receive's, and one re-armed every ~60 ms
        # the timer armed for the first receive's deadline came due long ago; the last receive's
        # deadline is still its own: 60 ms after it began, not the first one's
        started = loop.time()
        with pytest.raises(TimeoutError):
            await d.receive(q.get, started + 0.06)
        assert loop.time() - started >= 0.05
        d.close()
    run(main())


def test_an_earlier_deadline_than_the_timers_is_kept() -> None:
    async def main() -> None:
        loop, d, q = asyncio.get_running_loop(), ReceiveDeadline(), asyncio.Queue[int]()
        loop.call_later(0.001, q.put_nowait, 1)
        await d.receive(q.get, loop.time() + 30)
        started = loop.time()
        with pytest.raises(TimeoutError):
            await d.receive(q.get, started + 0.03)  # a session's end before the idle timeout
        assert loop.time() - started < 1
        with pytest.raises(TimeoutError):
            await d.receive(q.get, loop.time() - 1)  # passed already
        d.close()
    run(main())


def test_cut_ends_the_receive_waiting_now_and_nothing_else() -> None:
    async def main() -> None:
        loop, d, q = asyncio.get_running_loop(), ReceiveDeadline(), asyncio.Queue[int]()
        d.cut()  # nothing waiting: no effect
        loop.call_later(0.001, q.put_nowait, 1)
        assert await d.receive(q.get, loop.time() + 5) == 1
        loop.call_later(0.01, d.cut)
        started = loop.time()
        with pytest.raises(TimeoutError):
            await d.receive(q.get, loop.time() + 5)
        assert loop.time() - started < 1
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # the cut's cancellation was taken back
        await asyncio.sleep(0.01)  # and does not reach a later await
        d.close()
    run(main())


def test_a_cancellation_from_outside_is_not_turned_into_a_timeout() -> None:
    async def main() -> None:
        loop, d, q = asyncio.get_running_loop(), ReceiveDeadline(), asyncio.Queue[int]()

        async def receiver() -> int:
            return await d.receive(q.get, loop.time() + 5)
        task = asyncio.create_task(receiver())
        await asyncio.sleep(0.01)
        d.cut()
        task.cancel()  # the server's own shutdown of the task, as the cut comes
        with pytest.raises(asyncio.CancelledError):
            await task
        task = asyncio.create_task(receiver())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        d.close()
    run(main())
