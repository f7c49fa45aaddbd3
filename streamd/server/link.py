"""What the engine's process and a front-end process share (`server/frontends.py` there,
`server/worker.py` here): the spec a front end starts from, the listening socket on the shared
port, and every message of their channel (`server/channel.py` frames lists of them).

Messages are frozen dataclasses; each side dispatches on their class. A front end's audio of a
few milliseconds travels as one `SharedAudio` (its samples are in the front end's `AudioPipe`;
the engine's process cuts them per stream), or as one `StreamAudio` (the samples in the message)
when the pipe has no room; each engine hand-over of results as one `Results` (arrays: a step
delivers thousands, cut per stream here) followed by the `Done` and `Failed` of the streams it
finished.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

import numpy as np
from prometheus_client.metrics_core import Metric

from streamd.config import Config
from streamd.engine.types import ChunkResult, EngineStatus, StepResults
from streamd.server.audio_pipe import AudioPipe
from streamd.server.census import Census


@dataclass
class WorkerSpec:
    """Everything a front-end process starts from (pickled to it by `spawn`)."""

    index: int
    sock: socket.socket  # the front end's end of the channel
    config: Config
    audio: AudioPipe  # where the front end puts its streams' samples
    tokenizer: bytes  # the SentencePiece model proto
    model_name: str
    status: EngineStatus
    census: Census
    port: int


# -- front end -> engine ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OpenStream:
    """Give stream `stream_id` a slot (answered by `Opened`)."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class StreamAudio:
    """The audio queued for several streams, in order: `sizes[i]` float32 samples of stream
    `stream_ids[i]`, all in one array."""

    stream_ids: list[int]
    sizes: list[int]
    samples: np.ndarray


@dataclass(frozen=True, slots=True)
class SharedAudio:
    """`StreamAudio` whose samples are in the front end's `AudioPipe`: `sum(sizes)` float32
    samples from byte `at`; the engine frees them up to `end` once taken."""

    stream_ids: list[int]
    sizes: list[int]
    at: int
    end: int


@dataclass(frozen=True, slots=True)
class EndStream:
    """No more audio for stream `stream_id`: flush what is left (answered by `Done`)."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class CloseStream:
    """Release stream `stream_id`'s slot now."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class FrontMetrics:
    """The front end's connection-side metric families as they stand."""

    families: list[Metric]


@dataclass(frozen=True, slots=True)
class MetricsRequest:
    """A /metrics request: the daemon's text, answered by `MetricsText` with the same `request`."""

    request: int


@dataclass(frozen=True, slots=True)
class Up:
    """The front end listens (process id `pid`)."""

    pid: int


@dataclass(frozen=True, slots=True)
class NeedRoom:
    """A new stream needs the slot of the daemon's stream parked longest."""


ToEngine = OpenStream | SharedAudio | StreamAudio | EndStream | CloseStream | FrontMetrics | MetricsRequest | Up | NeedRoom


# -- engine -> front end ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Opened:
    """Stream `stream_id` has a slot (`error` None), or not (why)."""

    stream_id: int
    error: str | None


@dataclass(frozen=True, slots=True)
class Results:
    """One engine hand-over: stream `stream_ids[i]` ((n,) int64) gets row i of `chunks`."""

    stream_ids: np.ndarray
    chunks: StepResults

    def items(self) -> list[tuple[int, ChunkResult]]:
        return list(zip(self.stream_ids.tolist(), self.chunks.chunks()))


@dataclass(frozen=True, slots=True)
class Done:
    """Stream `stream_id` is flushed; its slot is free."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine could not process stream `stream_id` (its slot is free)."""

    stream_id: int
    message: str


@dataclass(frozen=True, slots=True)
class MetricsText:
    """The daemon's /metrics text for `MetricsRequest` `request`."""

    request: int
    text: bytes


@dataclass(frozen=True, slots=True)
class Status:
    """The engine's status, the draining flag and admission (streams admitted, the capacity
    estimate), sent whenever one changes."""

    engine: EngineStatus
    draining: bool
    admission: tuple[int, int | None]


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """A reloaded configuration."""

    config: Config


@dataclass(frozen=True, slots=True)
class Evict:
    """End your stream parked longest: the daemon needs its slot."""


@dataclass(frozen=True, slots=True)
class Handoff:
    """Close every stream with the handoff code, for its client to resume it elsewhere."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Drain the streams and exit."""


ToFront = Opened | Results | Done | Failed | MetricsText | Status | Reconfigure | Evict | Handoff | Shutdown


# -- the shared port ------------------------------------------------------------------------------

def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, not listening SO_REUSEPORT socket: it holds the port (a free one for port 0)
    that every front end then listens on."""
    return _reuse_port_socket(host, port)


def listening_socket(host: str, port: int) -> socket.socket:
    """A front end's own listening socket on the shared port."""
    sock = _reuse_port_socket(host, port)
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _reuse_port_socket(host: str, port: int) -> socket.socket:
    """SO_REUSEPORT (every front end listens on the port) and SO_REUSEADDR, as a single listener
    has: the connections it accepts inherit it, so that those the daemon closed, waiting out
    TIME_WAIT after it stopped, do not make the next start's check (`ports.check_free`) find
    the port in use for a minute."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    return sock
