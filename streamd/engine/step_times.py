"""The engine thread's own account of where its time goes, logged every few seconds."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger("streamd.engine")


@dataclass
class StepTimes:
    """Where the engine thread's time went since the last report (logged every `every_s`): each
    step's launch (host work: features, window layout, queuing the GPU work), the wait for the
    device (spent serving the front ends), and the results (read back, delivered)."""

    every_s: float = 10.0
    steps: int = 0
    streams: int = 0
    launch_s: float = 0.0
    device_s: float = 0.0
    results_s: float = 0.0
    since: float = field(default_factory=time.perf_counter)

    def add(self, batch: int, launch_s: float, device_s: float, results_s: float) -> None:
        self.steps += 1
        self.streams += batch
        self.launch_s += launch_s
        self.device_s += device_s
        self.results_s += results_s
        now = time.perf_counter()
        if now - self.since >= self.every_s:
            wall, n = now - self.since, self.steps
            busy = self.launch_s + self.device_s + self.results_s
            log.info("engine: %d steps in %.1f s, mean batch %.0f; per step: launch %.1f ms, on the device "
                     "(serving the front ends) %.1f ms, results %.1f ms; %.0f %% of the time between steps",
                     n, wall, self.streams / n, 1e3 * self.launch_s / n, 1e3 * self.device_s / n,
                     1e3 * self.results_s / n, 100 * max(0.0, 1 - busy / wall))
            self.steps = self.streams = 0
            self.launch_s = self.device_s = self.results_s = 0.0
            self.since = now
