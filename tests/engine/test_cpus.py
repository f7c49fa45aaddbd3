"""The engine thread's own CPU (`engine.thread_cpu`, `streamd/engine/cpus.py`)."""
from __future__ import annotations

import asyncio
import logging
import os
import threading

import numpy as np
import pytest

from helpers import random_model
from streamd.engine.cpus import ThreadCpu, _ranges
from streamd.engine.engine import Engine
from streamd.engine.recognizer import Recognizer

CPUS = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="needs a system that sets CPU sets, with 2 CPUs")


def test_a_cpu_this_process_may_not_use_is_refused_with_the_ones_it_may() -> None:
    if not hasattr(os, "sched_setaffinity"):
        with pytest.raises(ValueError, match="cannot give a thread its own CPU"):
            ThreadCpu(0)
        return
    with pytest.raises(ValueError, match=rf"may only run on CPUs {_ranges(CPUS)}"):
        ThreadCpu(max(CPUS) + 1000)


def test_cpu_ranges_read_as_an_operator_writes_them() -> None:
    assert _ranges({0, 1, 2, 3, 6}) == "0-3,6"
    assert _ranges({5}) == "5" and _ranges({1, 3, 4}) == "1,3-4"


@needs_two
def test_the_engine_thread_runs_alone_on_its_cpu_on_a_gpu_and_everywhere_on_the_cpu() -> None:
    """`place` sets the calling thread's set only: {cpu} for a GPU model, every CPU for a CPU one."""
    cpu = max(CPUS)
    seen: list[set[int]] = []

    def engine_thread() -> None:
        placed = ThreadCpu(cpu)
        placed.place("cuda")
        seen.append(os.sched_getaffinity(0))
        placed.place("cpu")
        seen.append(os.sched_getaffinity(0))

    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    assert seen == [{cpu}, CPUS]
    assert os.sched_getaffinity(0) == CPUS  # this thread was not touched


@needs_two
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_the_daemons_other_threads_keep_off_the_engine_cpu_until_it_stops(device: str,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """With `thread_cpu`, the starting thread (whose children are the front ends) keeps off the
    CPU from `start` to `stop`; the engine thread of a GPU model runs on that CPU alone, that of a
    CPU model is not pinned (its work needs every core: the log says the setting applies on a
    GPU); streams are served as without it."""
    cpu = max(CPUS)
    rec = Recognizer(random_model().to(device), capacity=2)

    async def main() -> tuple[set[int], set[int], int]:
        engine = Engine(rec, max_batch=2, batch_wait_s=0.0, thread_cpu=cpu)
        engine.start()
        try:
            starter = os.sched_getaffinity(0)
            engine_thread = await engine.call(lambda r: os.sched_getaffinity(0))
            session = await engine.open()
            engine.push(session, np.zeros(16000, dtype=np.float32))
            engine.end(session)
            results = 0
            while await session.results.get() is not None:
                results += 1
        finally:
            await engine.stop()
        return starter, engine_thread, results

    with caplog.at_level(logging.INFO, logger="streamd.engine"):
        starter, engine_thread, results = asyncio.run(main())
    assert starter == CPUS - {cpu} and results > 0
    assert engine_thread == ({cpu} if device == "cuda" else CPUS)
    assert os.sched_getaffinity(0) == CPUS  # restored at stop
    said = "alone" if device == "cuda" else "applies while the model is on a GPU"
    assert any(said in r.getMessage() for r in caplog.records)
