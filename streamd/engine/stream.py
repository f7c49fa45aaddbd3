"""One live stream's host-side state: incremental features and the mel frames not yet encoded.

Chunk geometry (mel frames of one hop, 10 ms at 16 kHz; encoder frames are S = 8 mel frames, 80
ms), derived from the model's dims: at right context R every step encodes a window of
W = 9 + S(R+1) mel frames and keeps R+1 encoder frames. A stream's first step takes 1 + SR new
frames, later steps S(R+1). The window's leading rows that precede the stream are masked as the
offline pass's causal zero padding, so streaming output is the offline output, chunk for chunk.
The last step takes whatever is left.
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

    @classmethod
    def of(cls, dims: ModelDims, right: int) -> ChunkGeometry:
        return cls(right, dims.subsampling_factor, dims.features.hop_length, dims.features.sample_rate)

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
class Window:
    """What a stream contributes to one encoder step: mel (n_mels, W), valid rows [start, length)."""

    mel: np.ndarray
    start: int
    length: int


@dataclass
class Stream:
    """Features and pending frames of one stream; the engine owns its slot in the batched state.

    Everything here is numpy: the engine thread must not spend a GIL release and re-acquire (a
    torch call) per stream, or a busy event loop stalls it (see `Recognizer.step`)."""

    slot: int
    features: IncrementalLogMel
    geometry: ChunkGeometry
    pending: np.ndarray  # (n_mels, k) mel frames computed, not yet encoded
    tail: np.ndarray  # (n_mels, <= 9) last encoded mel frames
    steps: int = 0
    ended: bool = False
    frames_decoded: int = 0  # encoder frames
    tokens: list[int] = field(default_factory=list)
    times: list[int] = field(default_factory=list)

    raw: list[np.ndarray] = field(default_factory=list)  # audio not yet handed to `features`
    samples: int = 0  # samples pushed so far
    frames_taken: int = 0  # mel frames consumed by steps

    @classmethod
    def new(cls, slot: int, logmel: LogMel, geometry: ChunkGeometry) -> Stream:
        empty = np.zeros((logmel.dims.n_mels, 0), dtype=np.float32)
        return cls(slot, IncrementalLogMel(logmel), geometry, empty, empty)

    def push_audio(self, samples: np.ndarray) -> None:
        """samples: (n,) float32 mono at the model's sample rate. Only queued: features are
        computed once per step, for a whole chunk and for all streams together."""
        if samples.size:
            self.raw.append(samples)
            self.samples += samples.size

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
        samples of the frames now computable (for `logmel_many`), or None.

        Only up to the next step's frames: a client that sends far ahead of real time must not
        make one step (and every other stream's results) wait for features of its whole backlog."""
        target = self.features.samples_for(self.frames_taken + self.need)
        fed: list[np.ndarray] = []
        missing = target - self.features.samples_seen
        while self.raw and missing > 0:
            piece = self.raw[0]
            if piece.size > missing:
                fed.append(piece[:missing])
                self.raw[0] = piece[missing:]
                break
            fed.append(self.raw.pop(0))
            missing -= piece.size
        if fed:
            self.features.feed(np.concatenate(fed) if len(fed) > 1 else fed[0])
        return self.features.take_segment(final=self.ended and not self.raw)

    def add_frames(self, frames: np.ndarray) -> None:
        """frames: (n_mels, k) computed from this stream's last `feature_segment()`."""
        self.pending = np.concatenate([self.pending, frames], axis=1) if self.pending.size else frames

    def take_window(self) -> Window:
        """Consume the next chunk (its frames must be pending) and lay it out in the uniform window."""
        g, need = self.geometry, self.need
        new = self.pending[:, :need]
        self.pending = self.pending[:, need:]
        self.frames_taken += new.shape[1]
        w = g.window
        lead = w - need  # rows before the new frames: 16 on the first step, 9 after
        mel = np.zeros((new.shape[0], w), dtype=np.float32)
        t = self.tail.shape[1]
        mel[:, lead - t: lead] = self.tail
        mel[:, lead: lead + new.shape[1]] = new
        self.tail = np.concatenate([self.tail, new], axis=1)[:, -PRE_ENCODE_CACHE:]
        self.steps += 1
        return Window(mel, lead - t, lead + new.shape[1])
