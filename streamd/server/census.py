"""Every front-end process's streams in shared memory, read by all of them for admission
(`server/frontends.py`)."""
from __future__ import annotations

import math
from typing import Any

from streamd.server.resume import Sessions


class Census:
    """Every front-end process's streams, in shared memory: process i writes index i of each
    array. `slots`: its open streams; `parked`: those parked (their slots go to new streams);
    `evicted`: those evicted for a new stream, not ended yet; `parked_since`: when its stream
    parked longest was parked (`time.monotonic`, one clock for the host; inf if none)."""

    def __init__(self, ctx: Any, workers: int) -> None:
        self.slots = ctx.Array("i", workers, lock=False)
        self.parked = ctx.Array("i", workers, lock=False)
        self.evicted = ctx.Array("i", workers, lock=False)
        self.parked_since = ctx.Array("d", [math.inf] * workers, lock=False)

    def set(self, index: int, streams: int, sessions: Sessions | None = None) -> None:
        """Process `index` holds `streams` open streams, and `sessions` (none: nothing parked)."""
        self.slots[index] = streams
        self.parked[index] = sessions.parked if sessions is not None else 0
        self.evicted[index] = sessions.evicted if sessions is not None else 0
        self.parked_since[index] = sessions.parked_since if sessions is not None else math.inf

    def total(self) -> int:
        return int(sum(self.slots))

    def parked_total(self) -> int:
        return int(sum(self.parked))

    def evicted_total(self) -> int:
        return int(sum(self.evicted))

    def parked_longest(self) -> int | None:
        """The process holding the stream parked longest; None if none is parked."""
        held = [i for i in range(len(self.parked)) if self.parked[i] > 0]
        return min(held, key=lambda i: self.parked_since[i]) if held else None
