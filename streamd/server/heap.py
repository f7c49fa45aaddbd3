"""The Python heap of a long-running daemon process: startup objects out of the collector's way."""
from __future__ import annotations

import gc
import logging

log = logging.getLogger("streamd.server")


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
