"""Probes that run steps on a recognizer outside serving: the warm-up's timing of batch sizes
(admission by capacity, `server/admission.py`) and a migration target's first chunk
(`engine/migration.py`)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import torch

from streamd.engine.recognizer import Recognizer

log = logging.getLogger("streamd.engine")


def capacity_probe(rec: Recognizer, sizes: list[int], seed: int = 0, stop: Callable[[], bool] = lambda: False
                   ) -> list[tuple[int, float]]:
    """Time one steady-state step (a stream's second) of each batch size; runs on the engine
    thread (`Engine.call`) before any client is served. Noise stands in for speech. Stops at the
    first size that runs out of GPU memory (the graph warm-up may have left too little for the
    largest batches): the start goes on with the sizes measured; and before the next size once
    `stop()` says the daemon is stopping (a CPU's largest sizes take seconds each)."""
    chunk_s = rec.geometry.chunk_ms / 1000
    audio = (np.random.default_rng(seed).standard_normal(int(rec.geometry.sample_rate * (3 * chunk_s + 0.5))) * 0.1).astype(np.float32)
    out = []
    for n in sizes:
        if stop():
            break
        streams = [rec.open() for _ in range(n)]
        try:
            for s in streams:
                s.push_audio(audio)
            rec.step([s for s in streams if s.ready])  # the first step has another shape
            if stop():
                break
            ready = [s for s in streams if s.ready]
            t0 = time.perf_counter()
            rec.step(ready)
            out.append((len(ready), time.perf_counter() - t0))
        except torch.OutOfMemoryError:
            log.warning("capacity probe stopped at %d streams: out of GPU memory", n)
            torch.cuda.empty_cache()
            break
        finally:
            for s in streams:
                rec.close(s)
    return out


def silent_chunk(rec: Recognizer) -> None:
    """One silent chunk through encoder and decoder (a migration's target, before the cut-over)."""
    s = rec.open()
    try:
        s.push_audio(np.zeros(rec.geometry.window * rec.geometry.hop, dtype=np.float32))
        s.end()
        while s.ready:
            rec.step([s])
    finally:
        rec.close(s)
