"""The event-loop watch (`server/loop_watch.py`): how late a loop serving streams wakes and how
much CPU its process takes, in the metrics and a log line."""
from __future__ import annotations

import asyncio
import gc
import logging
import re
import time

import pytest

from streamd.server.loop_watch import LoopLoad, watch
from streamd.server.metrics import Metrics


def sample(metrics: Metrics, name: str) -> float:
    return next(s.value for family in metrics.registry.collect() for s in family.samples if s.name == name)


def test_a_window_reports_lateness_and_cpu_share_then_starts_again() -> None:
    cpu = iter([10.0, 10.1, 10.3, 10.6, 11.0])  # the process's CPU seconds at start and each tick
    metrics = Metrics(process=False)
    load = LoopLoad("front end 2", metrics, cpu=lambda: next(cpu))
    for late in (0.002, 0.400, 0.010, 0.004):
        load.tick(late)
    line = load.report(2.0, streams=37)
    assert line == ("front end 2: 37 streams, 50 % of a CPU; its event loop woke 4 times in 2.0 s, "
                    "up to 400 ms late (p95 400 ms)")
    assert sample(metrics, "streamd_front_cpu_seconds_total") == pytest.approx(1.0)
    assert sample(metrics, "streamd_event_loop_lag_seconds_count") == 4
    assert sample(metrics, "streamd_event_loop_lag_seconds_sum") == pytest.approx(0.416)
    assert load.report(2.0, streams=37) is None  # a new window: nothing ticked since


def test_no_line_without_streams_and_no_cpu_where_the_engine_shares_the_process() -> None:
    load = LoopLoad("the daemon", Metrics(process=False), cpu=None)
    load.tick(0.001)
    assert load.report(1.0, streams=0) is None
    load.tick(0.003)
    assert load.report(1.0, streams=5) == "the daemon: 5 streams; its event loop woke 1 times in 1.0 s, up to 3 ms late (p95 3 ms)"


def test_watch_measures_a_loop_held_by_blocking_work(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics(process=False)

    async def main() -> None:
        task = asyncio.create_task(watch(LoopLoad("front end 0", metrics), lambda: 3, tick_s=0.01, every_s=0.2))
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # a handler that blocks the loop
        await asyncio.sleep(0.1)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="streamd.server"):
        asyncio.run(main())
    buckets = {s.labels["le"]: s.value for family in metrics.registry.collect() for s in family.samples
               if s.name == "streamd_event_loop_lag_seconds_bucket"}
    assert buckets["0.25"] < buckets["+Inf"]  # one wake-up came more than 250 ms late
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("front end 0: 3 streams, ")]
    assert lines, [r.getMessage() for r in caplog.records]
    late_ms = [int(re.search(r"up to (\d+) ms late", line).group(1)) for line in lines]  # type: ignore[union-attr]
    assert max(late_ms) >= 250, lines


def test_the_line_says_how_long_the_garbage_collector_held_the_process() -> None:
    """Every collection in the window, timed by the collector's callback: their total, how many
    were full (generation 2) and the longest; none, nothing said."""
    load = LoopLoad("front end 1", Metrics(process=False), cpu=None)
    for generation, held_s in ((0, 0.001), (2, 0.030), (1, 0.002)):
        load.collector("start", {"generation": generation})
        time.sleep(held_s)
        load.collector("stop", {"generation": generation, "collected": 0, "uncollectable": 0})
    load.tick(0.002)
    line = load.report(1.0, streams=4)
    assert line is not None and "; the garbage collector held it " in line and " in 3 collections (1 full), up to " in line
    longest = int(re.search(r"up to (\d+) ms$", line).group(1))  # type: ignore[union-attr]
    assert longest >= 30
    load.tick(0.002)
    assert "garbage collector" not in (load.report(1.0, streams=4) or "")  # a new window: no collection in it


def test_watch_times_the_collectors_pauses_while_it_runs(caplog: pytest.LogCaptureFixture) -> None:
    """`watch` puts its collector callback in `gc.callbacks` while it runs, and takes it out."""
    load = LoopLoad("front end 0", Metrics(process=False), cpu=None)

    async def main() -> None:
        task = asyncio.create_task(watch(load, lambda: 3, tick_s=0.01, every_s=0.2))
        await asyncio.sleep(0.05)
        assert load.collector in gc.callbacks
        gc.collect()  # a full collection, timed
        await asyncio.sleep(0.25)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level(logging.INFO, logger="streamd.server"):
        asyncio.run(main())
    assert load.collector not in gc.callbacks
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("front end 0")]
    full = [int(m.group(1)) for line in lines if (m := re.search(r"collections \((\d+) full\)", line))]
    assert full and max(full) >= 1, lines  # the gc.collect() above
