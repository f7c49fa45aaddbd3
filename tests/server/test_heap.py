"""Startup objects are frozen out of the cyclic collector's scans (full collections stay short)."""
from __future__ import annotations

import gc

from streamd.server.heap import freeze_startup_heap


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
