"""The Python heap of a long-running daemon process: startup objects out of the collector's way,
and a front end's collections spaced out."""
from __future__ import annotations

import gc
import logging

log = logging.getLogger("streamd.server")
# A front end's collector thresholds (Python's: 700, 10, 10). Front ends of 430-800 streams at
# 160-ms chunks (H100 host, benchmarks/h100-2026-12-06j) with Python's thresholds: 320-500
# collections in 10 s, 2-4 of them full, 0.47-0.84 s of the 10 s stopped, single pauses up to
# 119 ms; with these: 2-3 collections, none full, 0.04-0.07 s, up to 42 ms. Acyclic garbage is
# freed at once either way (reference counts); only cycles wait longer.
FRONT_END_GC_THRESHOLDS = (50_000, 20, 100)


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive now (imported modules, torch's and the model's
    Python objects: ~190 k) to the collector's permanent generation (`gc.freeze`), so that a full
    collection scans only what serving created since. Unfrozen, a full collection stalled the
    engine thread for ~100 ms with 3000 streams on a 2-core VM (after the freeze: 0.6 ms): a
    latency spike for every stream in that step. Returns the objects frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug("froze %d startup objects out of the cyclic collector's scans", frozen)
    return frozen


def collect_less_often(thresholds: tuple[int, int, int] = FRONT_END_GC_THRESHOLDS) -> None:
    """Space the cyclic collector's collections out (`gc.set_threshold`): a front end allocates
    many short-lived objects per message, which the default young-generation threshold turns into a
    collection every few milliseconds and promotes into frequent full ones."""
    gc.set_threshold(*thresholds)
    log.debug("cyclic collector thresholds %s", thresholds)
