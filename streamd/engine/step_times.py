"""The engine thread's own account of where its time goes, logged every few seconds."""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("streamd.engine")


class HostCpu:
    """The host's CPU time between two calls, from the kernel's counters (`/proc/stat`'s first
    line: user, nice, system, idle, iowait, irq, softirq, steal, in clock ticks)."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self.path = path
        self._last = self._read()

    def since_last(self) -> str:
        """'; the host's CPUs N % busy, M % stolen by the hypervisor' since the last call (or
        since this was made); '' where the counters cannot be read (not Linux)."""
        now, last = self._read(), self._last
        self._last = now
        if now is None or last is None:
            return ""
        d = [a - b for a, b in zip(now, last)]
        total = sum(d[:8])
        if total <= 0:
            return ""
        busy = total - d[3] - d[4] - d[7]  # running: all but idle, iowait and stolen
        return f"; the host's CPUs {100 * busy / total:.0f} % busy, {100 * d[7] / total:.0f} % stolen by the hypervisor"

    def _read(self) -> list[int] | None:
        try:
            with open(self.path) as f:
                fields = f.readline().split()
        except OSError:
            return None
        if len(fields) < 9 or fields[0] != "cpu":
            return None
        return [int(x) for x in fields[1:9]]


@dataclass
class StepTimes:
    """Where the engine thread's time went since the last report (logged every `every_s`): each
    step's launch (host work: features, window layout, queuing the GPU work), the wait for the
    device (spent serving the front ends), and the results (read back, delivered); on a GPU also
    how long the device itself worked on the steps (`Launched.device_s`), which says whether
    the GPU or the engine thread is what limits the steps; and how much of the wall time the
    engine thread actually ran on a CPU (`time.thread_time`, so `add` must be called on that
    thread): less than its launch and results took means it waited for the GIL or for a core
    meanwhile (the host's load average says whether its cores were all taken). The GPU line also
    says how much of the streams' audio rings the steps copied to the device (`Launched.ring_bytes`:
    the rows' segments where the GPU reads the pinned rings themselves; else a dense part copies
    every ring in its slot range, however few of those streams it steps); the
    step line, how much of a launch waited for the step before's copies (`Launched.ring_wait_s`).
    The CPU line also says how busy the host's CPUs were and how much of their time the
    hypervisor gave to other machines (`HostCpu`): on a virtual machine a thread can wait for
    a core with the load average well under the CPU count."""

    every_s: float = 10.0
    steps: int = 0
    streams: int = 0
    launch_s: float = 0.0
    ring_wait_s: float = 0.0  # of launch_s: waiting for the step before's copies from the rings
    device_s: float = 0.0
    results_s: float = 0.0
    gpu_s: float = 0.0  # the device's own time on the steps that measured it
    gpu_steps: int = 0
    ring_bytes: int = 0  # of the steps that measured the device
    since: float = field(default_factory=time.perf_counter)
    cpu_since: float | None = None  # the engine thread's CPU time at the window's start (set by `add`)
    memory: Callable[[], str | None] | None = None  # the device's memory in words, for the GPU line
    host: HostCpu = field(default_factory=HostCpu)

    def add(self, batch: int, launch_s: float, device_s: float, results_s: float,
            gpu_s: float | None = None, ring_bytes: int = 0, ring_wait_s: float = 0.0) -> None:
        if self.cpu_since is None:
            self.cpu_since = time.thread_time()
        self.steps += 1
        self.streams += batch
        self.launch_s += launch_s
        self.ring_wait_s += ring_wait_s
        self.device_s += device_s
        self.results_s += results_s
        if gpu_s is not None:
            self.gpu_s += gpu_s
            self.gpu_steps += 1
            self.ring_bytes += ring_bytes
        now = time.perf_counter()
        if now - self.since >= self.every_s:
            wall, n = now - self.since, self.steps
            busy = self.launch_s + self.device_s + self.results_s
            waited = f" ({1e3 * self.ring_wait_s / n:.1f} of it waiting for the step before's ring copies)" \
                if self.ring_wait_s else ""
            log.info("engine: %d steps in %.1f s, mean batch %.0f; per step: launch %.1f ms%s, on the device "
                     "(serving the front ends) %.1f ms, results %.1f ms; %.0f %% of the time between steps",
                     n, wall, self.streams / n, 1e3 * self.launch_s / n, waited, 1e3 * self.device_s / n,
                     1e3 * self.results_s / n, 100 * max(0.0, 1 - busy / wall))
            cpu = time.thread_time()
            log.info("engine: the engine thread ran on a CPU %.0f %% of the time (launching and delivering "
                     "took %.0f %%, serving the front ends some of the rest); load average %.1f on %d CPUs%s",
                     100 * (cpu - self.cpu_since) / wall, 100 * (self.launch_s + self.results_s) / wall,
                     os.getloadavg()[0], _cpus(), self.host.since_last())
            self.cpu_since = cpu
            if self.gpu_steps:
                memory = self.memory() if self.memory is not None else None
                copied = f"; {self.ring_bytes / self.gpu_steps / 1e6:.1f} MB of audio rings copied to it a step" \
                    if self.ring_bytes else ""
                log.info("engine: the GPU worked %.1f ms a step (%.1f us a stream), %.0f %% of the time%s%s",
                         1e3 * self.gpu_s / self.gpu_steps, 1e6 * self.gpu_s / self.streams, 100 * self.gpu_s / wall,
                         copied, f"; {memory}" if memory else "")
            self.steps = self.streams = self.gpu_steps = self.ring_bytes = 0
            self.launch_s = self.ring_wait_s = self.device_s = self.results_s = self.gpu_s = 0.0
            self.since = now


def _cpus() -> int:
    """The host's CPUs (the load average is the host's; the engine thread may be pinned to one)."""
    return os.cpu_count() or 1
