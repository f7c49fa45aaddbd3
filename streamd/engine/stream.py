"""One live stream's host-side state: incremental features and the mel frames not yet encoded.

Chunk geometry (mel frames of one hop, 10 ms at 16 kHz; encoder frames are S = 8 mel frames, 80
ms), derived from the model's dims: at right context R every step encodes a window of
W = 9 + S(R+1) mel frames and keeps R+1 encoder frames. A stream's first step takes 1 + SR new
frames, later steps S(R+1). The window's leading rows that precede the stream are masked as the
offline pass's causal zero padding, so streaming output is the offline output, chunk for chunk.
The last step takes whatever is left.

A stream holds no mel frames: a step computes the frames it consumes for all its streams at
once and assembles the windows where the model is (`Recognizer.launch`); the stream only
counts samples and frames and says where its frames go in the window (`Chunk`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamd.audio.features import IncrementalLogMel
from streamd.model.dims import ModelDims
from streamd.model.encoder import PRE_ENCODE_CACHE
from streamd.model.preprocessor import LogMel


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

    def samples_for(self, frames: int) -> int:
        """Samples of a live stream after which its first `frames` mel frames all exist (the
        signal goes on: `IncrementalLogMel.frames_for`)."""
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


@dataclass(frozen=True)
class Chunk:
    """Where a stream's frames go in one step's window (W columns): its last `tail` encoded frames
    (at most 9) end at column `lead`, its `new` frames start there; columns [start, length) hold
    frames, the rest are zero (those before `start` act as the causal zero padding)."""

    lead: int
    tail: int
    new: int

    @property
    def start(self) -> int:
        return self.lead - self.tail

    @property
    def length(self) -> int:
        return self.lead + self.new


@dataclass
class Stream:
    """Audio and frame bookkeeping of one stream; the engine owns its slot in the batched state
    (encoder and decoder state, and its last encoded mel frames).

    Everything here is numpy: the engine thread must not spend a GIL release and re-acquire (a
    torch call) per stream, or a busy event loop stalls it (see `Recognizer.step`)."""

    slot: int
    features: IncrementalLogMel
    geometry: ChunkGeometry
    steps: int = 0
    ended: bool = False
    frames_decoded: int = 0  # encoder frames
    tokens: list[int] = field(default_factory=list)  # the whole transcript, if the recognizer keeps it
    times: list[int] = field(default_factory=list)

    raw: list[np.ndarray] = field(default_factory=list)  # audio not yet handed to `features`
    samples: int = 0  # samples pushed so far
    frames_taken: int = 0  # mel frames consumed by steps
    full_at: int = 0  # samples that make the next full chunk (see `push_audio`)

    @classmethod
    def new(cls, slot: int, logmel: LogMel, geometry: ChunkGeometry) -> Stream:
        stream = cls(slot, IncrementalLogMel(logmel), geometry)
        stream.full_at = stream._samples_for_next_chunk()
        return stream

    def push_audio(self, samples: np.ndarray) -> bool:
        """samples: (n,) float32 mono at the model's sample rate. Only queued: features are
        computed once per step, for a whole chunk and for all streams together. Returns whether
        a full chunk is pending now (`ready`, in two comparisons: the engine asks per piece)."""
        if samples.size:
            self.raw.append(samples)
            self.samples += samples.size
        return self.samples >= self.full_at

    def end(self) -> None:
        """No more audio: the remaining frames become a last, shorter step."""
        self.ended = True

    @property
    def need(self) -> int:
        return self.geometry.new_frames(self.steps == 0)

    @property
    def frames_left(self) -> int:
        """Mel frames that exist (or will, once computed) and no step has taken yet."""
        return self.features.frames_for(self.samples, self.ended) - self.frames_taken

    @property
    def ready(self) -> bool:
        """A step can run: a full chunk is pending, or the stream ended with frames left."""
        n = self.frames_left
        return n >= self.need or (self.ended and n > 0)

    @property
    def finished(self) -> bool:
        return self.ended and self.frames_left == 0

    def feature_segment(self) -> np.ndarray | None:
        """Hand the queued audio the next step needs to the feature extractor and return the
        samples of the frames now computable (for `logmel_batch`), or None: exactly the frames
        the next step takes (`min(need, frames_left)` of a `ready` stream), no more.

        Only up to the next step's frames: a client that sends far ahead of real time must not
        make one step (and every other stream's results) wait for features of its whole backlog."""
        target = self.features.samples_for(self.frames_taken + self.need)
        missing = target - self.features.samples_seen
        fed: list[np.ndarray] = []
        while self.raw and missing > 0:
            piece = self.raw[0]
            if piece.size > missing:
                fed.append(piece[:missing])
                self.raw[0] = piece[missing:]
                break
            fed.append(self.raw.pop(0))
            missing -= piece.size
        self.features.feed(*fed)
        return self.features.take_segment(final=self.ended and not self.raw)

    def take_chunk(self, new: int) -> Chunk:
        """Consume the `new` frames of this step (those of the last `feature_segment()`, at most
        `need`) and say where they and the tail go in the window."""
        g, need = self.geometry, self.need
        if new > need:
            raise ValueError(f"a step takes at most {need} frames, not {new}")
        chunk = Chunk(lead=g.window - need, tail=min(self.frames_taken, PRE_ENCODE_CACHE), new=new)
        self.frames_taken += new
        self.steps += 1
        self.full_at = self._samples_for_next_chunk()
        return chunk

    def _samples_for_next_chunk(self) -> int:
        """Samples pushed at which the next step's frames all exist (before the end)."""
        return self.geometry.samples_for(self.frames_taken + self.need)
