"""The engine thread's own CPU (`engine.thread_cpu`). While the model is on a GPU, the engine
thread launches every step and delivers every result: its host work is the daemon's limit at
short chunks, and any other busy thread or process scheduled on its core (a front end, a load
generator on the same host) delays every stream. With a CPU given, the engine thread runs on it
alone and the daemon's other threads and processes keep off it.

On Linux a thread's CPU set is its own (`os.sched_setaffinity(0, ...)` sets the calling
thread's), and new threads and processes inherit their creator's: the thread that starts the
engine keeps off the CPU before the front ends are spawned from it. On a CPU device the engine
thread is not pinned (the model's own work needs every core), and a migration places it again.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("streamd.engine")


class ThreadCpu:
    """One CPU reserved for the engine thread, out of the CPUs this process may use."""

    def __init__(self, cpu: int) -> None:
        if not hasattr(os, "sched_setaffinity"):
            raise ValueError("engine.thread_cpu: this system cannot give a thread its own CPU")
        allowed = os.sched_getaffinity(0)
        if cpu not in allowed:
            raise ValueError(f"engine.thread_cpu {cpu}: this process may only run on CPUs {_ranges(allowed)}")
        if len(allowed) < 2:
            raise ValueError(f"engine.thread_cpu {cpu}: it is this process's only CPU (nothing left for the rest)")
        self.cpu, self.all = cpu, frozenset(allowed)
        self.pinned: bool | None = None  # not placed yet

    def keep_off(self) -> None:
        """The calling thread (and whatever it starts from now on) runs on every CPU but this one."""
        os.sched_setaffinity(0, self.all - {self.cpu})

    def restore(self) -> None:
        """The calling thread may run on every CPU again."""
        os.sched_setaffinity(0, self.all)

    def place(self, device_type: str) -> None:
        """On the engine thread: its CPU alone while the model is on a GPU, every CPU otherwise."""
        pin = device_type == "cuda"
        os.sched_setaffinity(0, {self.cpu} if pin else self.all)
        if pin != self.pinned:
            log.info("engine thread: %s", f"on CPU {self.cpu} alone" if pin else f"on CPUs {_ranges(self.all)}: "
                     f"engine.thread_cpu applies while the model is on a GPU (on the {device_type} its work "
                     "needs every core)")
        self.pinned = pin


def _ranges(cpus: set[int] | frozenset[int]) -> str:
    """'0-3,6' for {0, 1, 2, 3, 6}."""
    out: list[str] = []
    for c in sorted(cpus):
        if out and out[-1].split("-")[-1] == str(c - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)
