"""Startup objects are frozen out of the cyclic collector's scans (full collections stay short), and
a front end's collections are spaced out."""
from __future__ import annotations

import gc

from streamd.server.heap import FRONT_END_GC_THRESHOLDS, collect_less_often, freeze_startup_heap


def test_freeze_moves_the_startup_heap_out_of_full_collections() -> None:
    startup = [{"i": i, "parts": [i, (i,)]} for i in range(100_000)]  # stands in for modules, torch, the model
    gc.collect()
    scanned_before = sum(len(gc.get_objects(g)) for g in range(3))
    try:
        assert freeze_startup_heap() >= 2 * len(startup)
        scanned_after = sum(len(gc.get_objects(g)) for g in range(3))
        assert scanned_before >= 2 * len(startup) and scanned_after < len(startup) // 10
    finally:
        gc.unfreeze()


def test_a_front_ends_collector_runs_far_less_often() -> None:
    def collections_while_allocating() -> int:
        seen: list[int] = []

        def count(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                seen.append(info["generation"])
        gc.callbacks.append(count)
        try:
            cycles = []
            for i in range(20_000):  # a front end's messages leave tracked objects behind like these
                a: list[object] = [i]
                a.append(a)
                cycles.append(a)
        finally:
            gc.callbacks.remove(count)
        return len(seen)

    before = gc.get_threshold()
    try:
        default = collections_while_allocating()
        collect_less_often()
        assert gc.get_threshold() == FRONT_END_GC_THRESHOLDS
        spaced = collections_while_allocating()
    finally:
        gc.set_threshold(*before)
    assert default >= 20 and spaced == 0
