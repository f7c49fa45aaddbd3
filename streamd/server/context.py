"""What every connection of one process shares (`StreamContext`), and the engine's process's
own (`ServerState`). Without torch: a front-end process serves its connections with it."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from streamd.audio.activity import ActivityBatch
from streamd.config import Config
from streamd.engine.types import ChunkGeometry, EngineClient
from streamd.model.tokenizer import Tokenizer
from streamd.server.admission import Capacity
from streamd.server.census import Census
from streamd.server.metrics import Metrics
from streamd.server.resume import Sessions

if TYPE_CHECKING:
    from streamd.engine.engine import Engine
    from streamd.model.transducer import Transducer


@dataclass
class StreamContext:
    """What every connection of one process shares: the engine's own process, or a front-end
    process (`server/worker.py`)."""

    config: Config
    engine: EngineClient
    tokenizer: Tokenizer
    metrics: Metrics
    model_name: str
    shutdown: asyncio.Event = field(default_factory=asyncio.Event)
    live: set[asyncio.Task[None]] = field(default_factory=set)
    draining: bool = False  # admin drain: no new streams, live ones go on
    census: Census | None = None  # with front-end processes: the daemon's streams
    evict_elsewhere: Callable[[], None] | None = None  # a front end: ask the engine's process to evict
    census_slot: int = 0  # this process's slot in `census`
    listeners: list[Callable[[], None]] = field(default_factory=list)  # told of `changed()`
    sessions: Sessions = field(default_factory=lambda: Sessions(0.0))  # resumable streams (resume.py)
    capacity: Capacity | None = None  # admission by measured capacity (admission.py), engine's process
    published: tuple[int, int | None] | None = None  # a front end: (limit, estimate) the engine's process sent
    handoff_hooks: list[Callable[[], int]] = field(default_factory=list)  # front ends: hand their streams off
    gates: ActivityBatch = field(default_factory=ActivityBatch)  # the sessions' speech gates, analysed together

    def __post_init__(self) -> None:
        self.sessions.on_change = self.count_live

    @property
    def device(self) -> str:
        return self.engine.status.device

    @property
    def dtype(self) -> str:
        return self.engine.status.dtype

    @property
    def stalled(self) -> bool:
        """The engine thread has made no step for long while streams wait (the engine's status says)."""
        return self.engine.status.stalled

    @property
    def cutting_over(self) -> bool:
        """A migration is swapping the model in (the engine's status says)."""
        return self.engine.status.cutting_over

    @property
    def geometry(self) -> ChunkGeometry:
        return self.engine.status.geometry

    @property
    def chunk_ms(self) -> int:
        return self.engine.status.geometry.chunk_ms

    def admission(self) -> tuple[int, int | None]:
        """(streams admitted, the real-time capacity estimate): min(max_streams, the estimate) with
        admission by capacity (streamd.server.admission), else max_streams."""
        if self.capacity is not None:
            return self.capacity.limit, self.capacity.estimate
        if self.published is not None:
            return self.published
        return self.config.server.max_streams, None

    def streams(self) -> int:
        """Open streams of the whole daemon."""
        return self.census.total() if self.census is not None else len(self.live)

    def parked(self) -> int:
        """Parked streams of the whole daemon."""
        return self.census.parked_total() if self.census is not None else self.sessions.parked

    def reclaimable(self) -> int:
        """Streams of the whole daemon whose slot a new stream may take: parked, or evicted and
        ending now."""
        if self.census is None:
            return self.sessions.reclaimable
        return self.census.parked_total() + self.census.evicted_total()

    def make_room(self, others: int) -> None:
        """A new stream needs a slot beside `others` open streams: unless the evicted streams
        ending now make enough room, end the stream parked longest in the daemon (front ends: the
        engine's process has the one that holds it evict it, `server/frontends.py`)."""
        evicted = self.census.evicted_total() if self.census is not None else self.sessions.evicted
        if others - evicted < self.admission()[0]:
            return
        if self.evict_elsewhere is not None:
            self.evict_elsewhere()
        else:
            self.sessions.evict()

    def count_live(self) -> None:
        """Publish this process's open and parked streams (after `live` or `sessions` changed)."""
        if self.census is not None:
            self.census.set(self.census_slot, len(self.live), self.sessions)

    def hand_off(self) -> int:
        """Close every live stream with the handoff code, for its client to resume it elsewhere
        (this process's and every front end's); returns how many."""
        return self.sessions.handoff() + sum(hook() for hook in self.handoff_hooks)

    def changed(self) -> None:
        """Draining, cutting over, device or dtype changed: tell the listeners (front ends)."""
        for notify in self.listeners:
            notify()


@dataclass
class ServerState(StreamContext):
    """The engine's process: the engine itself and the weights every placement is made from."""

    engine: Engine = field(kw_only=True)
    master: Transducer = field(kw_only=True)  # fp32 CPU weights as loaded
