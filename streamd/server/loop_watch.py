"""How busy the event loop that serves streams is: how late it wakes, and (a front-end process)
how much of a CPU the process takes.

Every stream of an event loop waits for it: a loop that wakes 300 ms late holds every one of its
streams' audio and results back by as much, whatever the engine does. The engine's log says how
busy the engine thread and the GPU are (`engine/step_times.py`); this says the same of the front
ends, in `streamd_event_loop_lag_seconds`, `streamd_front_cpu_seconds_total` and a log line
every `REPORT_EVERY_S` while streams are open. The line also says how long Python's cyclic
garbage collector held the process (`CollectorPauses`): a collection stops every thread of it,
the loop's and the engine thread's alike, and a full one scans every object serving created.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import math
import time
from collections.abc import Callable

from streamd.server.metrics import Metrics

log = logging.getLogger("streamd.server")
TICK_S = 0.1  # how often the loop is asked to wake: its lateness is measured this often
REPORT_EVERY_S = 10.0


class CollectorPauses:
    """The cyclic garbage collector's collections in this process, timed (a `gc.callbacks` entry:
    `watch` registers it while it runs)."""

    def __init__(self) -> None:
        self._began = 0.0
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds) since the last `take`

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._began))

    def take(self) -> list[tuple[int, float]]:
        pauses, self.pauses = self.pauses, []
        return pauses


class LoopLoad:
    """One event loop's lateness and its process's CPU time since the last report.

    Args:
        name: whose loop, for the log line ("front end 3", "the daemon").
        metrics: where each lateness and the CPU time go.
        cpu: the process's CPU seconds so far (`time.process_time`), or None where the process
            also runs the engine thread (`--workers 0`: its CPU time says nothing of the loop).
    """

    def __init__(self, name: str, metrics: Metrics, cpu: Callable[[], float] | None = time.process_time) -> None:
        self.name, self.metrics, self.cpu = name, metrics, cpu
        self._late: list[float] = []
        self._cpu_at = cpu() if cpu is not None else 0.0
        self._cpu_window = 0.0
        self.collector = CollectorPauses()

    def tick(self, late_s: float) -> None:
        """The loop woke `late_s` after it was due."""
        self._late.append(late_s)
        self.metrics.loop_lag.observe(late_s)
        if self.cpu is not None:
            now = self.cpu()
            self.metrics.front_cpu.inc(now - self._cpu_at)
            self._cpu_window += now - self._cpu_at
            self._cpu_at = now

    def report(self, wall_s: float, streams: int) -> str | None:
        """The window's line (None without a tick or a stream), and a new window."""
        late, cpu_s, pauses = sorted(self._late), self._cpu_window, self.collector.take()
        self._late, self._cpu_window = [], 0.0
        if not late or not streams:
            return None
        p95 = late[min(len(late) - 1, math.ceil(0.95 * len(late)) - 1)]
        cpu = f", {100 * cpu_s / wall_s:.0f} % of a CPU" if self.cpu is not None else ""
        held = ""
        if pauses:
            full = sum(1 for generation, _ in pauses if generation == 2)
            held = (f"; the garbage collector held it {1e3 * sum(s for _, s in pauses):.0f} ms in {len(pauses)} "
                    f"collections ({full} full), up to {1e3 * max(s for _, s in pauses):.0f} ms")
        return (f"{self.name}: {streams} streams{cpu}; its event loop woke {len(late)} times in {wall_s:.1f} s, "
                f"up to {1e3 * late[-1]:.0f} ms late (p95 {1e3 * p95:.0f} ms){held}")


async def wake_ups(on_late: Callable[[float], None], tick_s: float = TICK_S) -> None:
    """Sleep `tick_s` over and over and tell `on_late` how many seconds late each wake-up came
    (runs until cancelled; the migration benchmark's client processes use it too)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + tick_s
        await asyncio.sleep(tick_s)
        on_late(max(0.0, loop.time() - due))


async def watch(load: LoopLoad, streams: Callable[[], int], tick_s: float = TICK_S,
                every_s: float = REPORT_EVERY_S) -> None:
    """Tell `load` how late each wake-up came and time the collector's pauses meanwhile; log its
    line every `every_s` (runs until cancelled)."""
    loop = asyncio.get_running_loop()
    since = loop.time()

    def on_late(late_s: float) -> None:
        nonlocal since
        load.tick(late_s)
        if (now := loop.time()) - since >= every_s:
            line = load.report(now - since, streams())
            if line is not None:
                log.info(line)
            since = now

    gc.callbacks.append(load.collector)
    try:
        await wake_ups(on_late, tick_s)
    finally:
        gc.callbacks.remove(load.collector)
