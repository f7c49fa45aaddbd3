"""What crosses the engine's boundary, without torch: the chunk geometry, a step's results, the
status snapshot and the handles of a stream. A front-end process and the session layer import
these and never load torch (tests/test_layering.py)."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from streamd.errors import StreamFailed
from streamd.model.dims import PRE_ENCODE_CACHE, ModelDims

if TYPE_CHECKING:
    from streamd.engine.stream import Stream


def frames_ready(samples: int, ended: bool, hop: int, half: int) -> int:
    """Mel frames of a live signal once `samples` samples have arrived (all of them, if it
    `ended`: the offline count, samples // hop; before, a frame needs its whole window, `half`
    samples either side of its centre). `ChunkGeometry` and `audio.features` count with it."""
    if ended:
        return samples // hop
    if samples < half:
        return 0
    return min((samples - half) // hop + 1, samples // hop)


@dataclass(frozen=True)
class ChunkGeometry:
    """Step sizes and the time base of a model at right context `right` (R): `subsampling` (S)
    mel frames per encoder frame, `hop` samples per mel frame at `sample_rate` Hz. Everything
    that converts samples or frames to time reads it here (`of`: from the model's dims)."""

    right: int
    subsampling: int
    hop: int
    sample_rate: int
    half_window: int = 256  # n_fft // 2: a mel frame's samples on either side of its centre

    @classmethod
    def of(cls, dims: ModelDims, right: int) -> ChunkGeometry:
        f = dims.features
        return cls(right, dims.subsampling_factor, f.hop_length, f.sample_rate, f.n_fft // 2)

    @property
    def n_fft(self) -> int:
        return 2 * self.half_window

    def frames_for(self, samples: int, ended: bool) -> int:
        """Mel frames of a live stream once `samples` samples have arrived (`frames_ready`)."""
        return frames_ready(samples, ended, self.hop, self.half_window)

    def segment_samples(self, frames: int) -> int:
        """Samples a step of `frames` new frames copies: their windows, one sample before
        (pre-emphasis reads it) and nothing more."""
        return (frames - 1) * self.hop + self.n_fft + 1

    def samples_for(self, frames: int) -> int:
        """Samples of a live stream after which its first `frames` mel frames all exist (the
        signal goes on): the inverse of `frames_for`."""
        return 0 if frames <= 0 else max((frames - 1) * self.hop + self.half_window, frames * self.hop)

    def frames_after(self, steps: int) -> int:
        """Mel frames the first `steps` full steps consume."""
        return 0 if steps <= 0 else self.new_frames(True) + (steps - 1) * self.new_frames(False)

    @property
    def window(self) -> int:
        """W: mel frames fed per step."""
        return PRE_ENCODE_CACHE + self.subsampling * (self.right + 1)

    def new_frames(self, first: bool) -> int:
        """New mel frames a full step consumes."""
        return 1 + self.subsampling * self.right if first else self.subsampling * (self.right + 1)

    @property
    def frame_ms(self) -> float:
        """Milliseconds per encoder frame (80.0; exact whenever it is a whole number)."""
        return self.hop * self.subsampling * 1000 / self.sample_rate

    @property
    def frame_seconds(self) -> float:
        """Seconds per encoder frame (0.08): the unit of every time a result carries."""
        return self.hop * self.subsampling / self.sample_rate

    @property
    def chunk_ms(self) -> int:
        """Audio per full step: R+1 encoder frames (in whole ms, as the protocol's ``ready`` says)."""
        return self.hop * self.subsampling * (self.right + 1) * 1000 // self.sample_rate


@dataclass
class ChunkResult:
    """One stream's outcome of one step: new labels with global encoder-frame times, and the
    encoder frames [frame_start, frame_end) this step decoded. Plain data: it crosses processes."""

    tokens: list[int]
    times: list[int]
    frame_start: int
    frame_end: int


@dataclass
class StepResults:
    """A step's results, row i for its i-th stream, as arrays (a step of thousands of streams
    lands in a few numpy calls, and a front end's rows cross processes as one message): row i's
    first lengths[i] entries of labels and times (n, width) int64 are its new labels and their
    global encoder-frame times; it decoded encoder frames [start[i], end[i]). `chunks()` makes
    each row a `ChunkResult` (where a session's queue needs one)."""

    labels: np.ndarray
    times: np.ndarray
    lengths: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return len(self.lengths)

    def chunks(self) -> list[ChunkResult]:
        """Every row's `ChunkResult`, in order (a few calls for the whole step; the torch-side
        twin for a decoder's output is `BatchedHyps.to_lists`, below the engine's layer)."""
        n = self.lengths.tolist()
        width = max(n, default=0)  # only the columns some row uses become Python ints
        labels = self.labels[:, :width].tolist() if width else [[]] * len(n)
        times = self.times[:, :width].tolist() if width else [[]] * len(n)
        return [ChunkResult(labels[i][: n[i]], times[i][: n[i]], start, end)
                for i, (start, end) in enumerate(zip(self.start.tolist(), self.end.tolist()))]

    def rows(self, index: np.ndarray) -> StepResults:
        """The rows `index` (int64), in that order, trimmed to the columns they use."""
        lengths = self.lengths[index]
        width = int(lengths.max()) if lengths.size else 0
        return StepResults(self.labels[index, :width], self.times[index, :width], lengths, self.start[index],
                           self.end[index])

    @staticmethod
    def joined(parts: list[StepResults]) -> StepResults:
        """The parts' rows one after another (the widths padded to the widest; no parts: no rows)."""
        if not parts:
            none = np.zeros(0, np.int64)
            return StepResults(none.reshape(0, 0), none.reshape(0, 0), none, none, none)
        if len(parts) == 1:
            return parts[0]
        width = max(p.labels.shape[1] for p in parts)

        def wide(a: np.ndarray) -> np.ndarray:
            return np.pad(a, ((0, 0), (0, width - a.shape[1])))
        return StepResults(np.concatenate([wide(p.labels) for p in parts]), np.concatenate([wide(p.times) for p in parts]),
                           *(np.concatenate([getattr(p, k) for p in parts]) for k in ("lengths", "start", "end")))


ResultItem = ChunkResult | StreamFailed | None  # None: the stream is flushed and its slot free
Ended = tuple["EngineSession", StreamFailed | None]  # a stream flushed (None) or failed


@dataclass
class Handover:
    """What one engine hand-over gives one sink: row i of `results` is the step's result of
    `sessions[i]`; then `ended`, the streams flushed or failed, in order (a stream's last result
    comes before its end). The results are None when no step landed (a failure, an end)."""

    sessions: list[EngineSession]
    results: StepResults | None
    ended: list[Ended]

    def items(self) -> list[tuple[EngineSession, ResultItem]]:
        """One (session, item) per result, then per end: what each session's queue gets."""
        chunks = self.results.chunks() if self.results is not None else []
        items: list[tuple[EngineSession, ResultItem]] = list(zip(self.sessions, chunks))
        return items + list(self.ended)


Sink = Callable[[Handover], None]


@dataclass(frozen=True)
class EngineStatus:
    """A snapshot of what serving needs to know of the engine (the event loop never reads
    engine-thread objects for it; a front-end process gets it sent)."""

    device: str
    dtype: str
    geometry: ChunkGeometry  # the model's time base and chunk size
    capacity: int = 0  # stream slots
    encoder: str = "eager"  # how the last step encoded: "graphs" or "eager"
    decoder: str = "eager"  # how the last step decoded: "full_graph", "no_while_loops" or "eager"
    attention: str = "explicit"  # how steps attend: "kernel" (Triton), "sdpa" or "explicit"
    cutting_over: bool = False  # a migration is swapping the model in: steps wait
    eager_reason: str = ""  # why the last step encoded or decoded without CUDA graphs ('' when both used them)
    stalled: bool = False  # streams wait and the engine thread has made no step for long (`Engine.stalled`)
    calls: int = 0  # encoder (and decoder) calls since start: one per launched step part
    eager_calls: tuple[int, int] = (0, 0)  # of them, those the encoder and the decoder ran eagerly
    # ... and those that replayed a larger batch bucket's graph than their own, padded (a move's
    # target: `buckets.cover`; a capture held, spaced or failed)
    padded_calls: tuple[int, int] = (0, 0)


class EngineClient(Protocol):
    """What serving streams needs of the engine: the `Engine` itself, or the handle a front-end
    process has of it (`server/worker.py`)."""

    @property
    def status(self) -> EngineStatus: ...

    async def open(self) -> EngineSession: ...

    def push(self, session: EngineSession, samples: np.ndarray) -> None: ...

    def end(self, session: EngineSession) -> None: ...

    def close(self, session: EngineSession) -> None: ...


@dataclass(eq=False)
class EngineSession:
    """Loop-side handle of one engine stream. `results` yields ChunkResults, then None when the
    stream has been flushed (after `end`), or a StreamFailed. With a `sink`, results go there
    instead (called on the engine thread with every item of one hand-over, in order). `id`: its
    number, unique in the process that opened it (`Engine.open`; in a front-end process
    `RemoteEngine.open`, whose number the engine's bridge keeps)."""

    id: int = -1
    results: asyncio.Queue[ResultItem] = field(default_factory=asyncio.Queue)
    stream: Stream | None = None  # owned by the engine thread
    closed: bool = False
    sink: Sink | None = None
    in_flight: int = 0  # launched steps of this stream whose results are not delivered yet
