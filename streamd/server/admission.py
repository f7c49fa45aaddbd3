"""Admission by capacity: how many streams this daemon can serve in real time.

Each stream delivers a chunk every `chunk_s`, at its own phase. The engine steps continuously:
each step decodes the streams whose chunk became ready during the previous one. With steps of
B seconds, a step serves N x B / chunk_s streams, and a result comes about chunk + 2B after its
audio (the chunk, the step in progress, its own step). So N streams keep real time with bounded
latency when a step of N x B / chunk_s streams takes at most B: N = b(B) x chunk_s / B, where
b(B) is the largest batch whose step takes at most B = `utilization x chunk_s`.

b(B) comes from measured step times: at warm-up `engine.probes.capacity_probe` times steps of 1, 4,
16, ... up to `max_streams` streams on the serving device, dtype and chunk size; afterwards every live step
(its seconds and batch size, from the engine's step observer) moves the time of its batch-size
bucket (an exponential moving average), so the estimate follows the load, a migration or a busy
machine. Between buckets the step time is interpolated linearly (extrapolated past the largest).
The daemon admits `min(max_streams, estimate)` streams.
"""
from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

log = logging.getLogger("streamd.server")
ALPHA = 0.05  # weight of one live step in its bucket's average
PROBE_GROWTH = 4
MAX_FACTOR = 16  # the estimate is reported up to this many times max_streams


def probe_sizes(max_streams: int) -> list[int]:
    """Batch sizes timed at warm-up: 1, 4, 16, ... and `max_streams`."""
    sizes, n = [], 1
    while n < max_streams:
        sizes.append(n)
        n *= PROBE_GROWTH
    return sizes + [max_streams]


class Capacity:
    """The real-time stream estimate from warm-up and live step times.

    `observe` runs on the engine thread, `limit` and `estimate` are read on the event loop.
    `on_change(estimate, limit)` is called whenever they change.
    """

    def __init__(self, chunk_s: float, max_streams: int, utilization: float, enabled: bool = True,
                 on_change: Callable[[int, int], None] | None = None) -> None:
        self.chunk_s, self.max_streams, self.utilization, self.enabled = chunk_s, max_streams, utilization, enabled
        self._on_change = on_change
        self._buckets: dict[int, tuple[float, float]] = {}  # bucket -> (mean batch, mean seconds)
        self._lock = threading.Lock()
        self.estimate = max_streams  # until measured

    @property
    def limit(self) -> int:
        """Streams admitted now."""
        return min(self.max_streams, self.estimate) if self.enabled else self.max_streams

    @property
    def budget_s(self) -> float:
        return self.utilization * self.chunk_s

    def seed(self, timings: list[tuple[int, float]]) -> None:
        """The warm-up probe's (batch, seconds) pairs."""
        with self._lock:
            for n, seconds in timings:
                self._buckets[_bucket(n)] = (float(n), seconds)
        self._update()
        log.info("capacity: %d real-time streams estimated (steps: %s; step budget %.0f ms per %.0f ms chunk)",
                 self.estimate, ", ".join(f"{n}: {s * 1000:.1f} ms" for n, s in timings),
                 self.budget_s * 1000, self.chunk_s * 1000)

    def observe(self, seconds: float, batch: int) -> None:
        """One live step of `batch` streams took `seconds`."""
        key = _bucket(batch)
        with self._lock:
            old = self._buckets.get(key)
            self._buckets[key] = ((float(batch), seconds) if old is None else
                                  (old[0] + ALPHA * (batch - old[0]), old[1] + ALPHA * (seconds - old[1])))
        self._update()

    def points(self) -> list[tuple[float, float]]:
        """(batch, seconds) per bucket, by batch, step times made non-decreasing."""
        with self._lock:
            pts = sorted(self._buckets.values())
        out: list[tuple[float, float]] = []
        for n, s in pts:
            out.append((n, max(s, out[-1][1]) if out else s))
        return out

    def _update(self) -> None:
        old = self.estimate
        cap = MAX_FACTOR * self.max_streams
        batch = estimate(self.points(), self.budget_s, cap)
        self.estimate = min(cap, math.floor(batch * self.chunk_s / self.budget_s + 1e-9))
        if self.estimate != old and self._on_change is not None:
            self._on_change(self.estimate, self.limit)


def _bucket(n: int) -> int:
    """Batch sizes share a bucket per half octave."""
    return round(2 * math.log2(max(n, 1)))


def estimate(points: list[tuple[float, float]], budget_s: float, cap: int) -> int:
    """The largest batch whose step time fits in `budget_s` on the piecewise-linear curve through
    `points` ((batch, seconds), sorted, non-decreasing), extrapolated past the last point with
    the last segment's slope (the first point's time per stream with one point); at least 1
    (one stream is always served, if slowly), at most `cap`."""
    if not points:
        return cap
    def clamp(n: float) -> int:
        return int(max(1, min(cap, math.floor(n + 1e-9))))  # 9.999999 streams are 10

    if len(points) == 1:
        n, s = points[0]
        return clamp(n + (budget_s - s) * n / s) if s > 0 else cap
    if points[0][1] > budget_s:
        return 1
    for (n0, s0), (n1, s1) in zip(points, points[1:]):
        if s1 > budget_s:
            return clamp(n0 + (budget_s - s0) * (n1 - n0) / (s1 - s0))
    (n0, s0), (n1, s1) = points[-2], points[-1]
    slope = (s1 - s0) / (n1 - n0) if n1 > n0 else 0.0
    return clamp(n1 + (budget_s - s1) / slope) if slope > 0 else cap
