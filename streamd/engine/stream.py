"""One live stream's host-side state: its raw samples not yet framed, and what it has consumed.

Chunk geometry (mel frames of one hop, 10 ms at 16 kHz; encoder frames are S = 8 mel frames, 80
ms), derived from the model's dims: at right context R every step encodes a window of
W = 9 + S(R+1) mel frames and keeps R+1 encoder frames. A stream's first step takes 1 + SR new
frames, later steps S(R+1). The window's leading rows that precede the stream are masked as the
offline pass's causal zero padding, so streaming output is the offline output, chunk for chunk.
The last step takes whatever is left.

A stream holds no mel frames: a step copies the raw samples of the frames it consumes, for all
its streams, into one batch (`Stream.take`), computes their pre-emphasis and frames in one call
and assembles the windows where the model is (`Recognizer.launch`); the stream only keeps its
samples (in its slot's row of one array the recognizer owns) and counts samples and frames.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamd.engine.types import ChunkGeometry
from streamd.model.dims import PRE_ENCODE_CACHE


@dataclass
class Stream:
    """Audio and frame bookkeeping of one stream; the engine owns its slot in the batched state
    (encoder and decoder state, and its last encoded mel frames).

    Samples live in `row` (the slot's row of the recognizer's sample array): row[c] is sample
    `origin + c` of the padded signal, which has zeros before sample 0 (the offline STFT's centre
    padding, and the zero pre-emphasis reads before the first sample). Pieces that do not fit
    yet wait in `raw`. Everything here is numpy: the engine thread must not spend a GIL release
    and re-acquire (a torch call) per stream, or a busy event loop stalls it (see
    `Recognizer.launch`)."""

    slot: int
    row: np.ndarray  # (M,) float32
    geometry: ChunkGeometry
    steps: int = 0
    ended: bool = False
    frames_decoded: int = 0  # encoder frames
    tokens: list[int] = field(default_factory=list)  # the whole transcript, if the recognizer keeps it
    times: list[int] = field(default_factory=list)

    raw: list[np.ndarray] = field(default_factory=list)  # audio not in `row` yet, in order
    samples: int = 0  # samples pushed so far
    frames_taken: int = 0  # mel frames consumed by steps
    full_at: int = 0  # samples that make the next full chunk (see `push_audio`)
    origin: int = 0  # padded-signal index of row[0]
    filled: int = 0  # row[:filled] holds samples (or the leading zeros)

    @classmethod
    def new(cls, slot: int, row: np.ndarray, geometry: ChunkGeometry) -> Stream:
        """A stream in a (reused) slot's row: its leading zeros are written here."""
        lead = geometry.half_window + 1
        row[:lead] = 0.0
        stream = cls(slot, row, geometry, origin=-lead, filled=lead)
        stream.full_at = stream._samples_for_next_chunk()
        return stream

    def push_audio(self, samples: np.ndarray) -> bool:
        """samples: (n,) float32 mono at the model's sample rate, copied into the stream's row (or
        queued, when it does not fit yet). Returns whether a full chunk is pending now (`ready`,
        in two comparisons: the engine asks per piece)."""
        n = samples.size
        if n:
            if not self.raw and self.filled + n > self.row.size:  # drop what no step needs any more
                self._compact(self.frames_taken * self.geometry.hop - self.geometry.half_window - 1)
            if not self.raw and self.filled + n <= self.row.size:
                self.row[self.filled: self.filled + n] = samples
                self.filled += n
            else:
                self.raw.append(samples)
            self.samples += n
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
        return self.geometry.frames_for(self.samples, self.ended) - self.frames_taken

    @property
    def ready(self) -> bool:
        """A step can run: a full chunk is pending, or the stream ended with frames left."""
        n = self.frames_left
        return n >= self.need or (self.ended and n > 0)

    @property
    def finished(self) -> bool:
        return self.ended and self.frames_left == 0

    def next_frames(self) -> int:
        """New mel frames the next step takes: `min(need, frames_left)` of a `ready` stream.

        Only up to the next step's frames: a client that sends far ahead of real time must not
        make one step (and every other stream's results) wait for its whole backlog."""
        return min(self.need, self.frames_left)

    def take(self, new: int, out: np.ndarray) -> tuple[int, int, int]:
        """Consume the next `new` frames (`next_frames()`): copy their samples (`segment_samples`,
        from one sample before their first window on) into `out`. Returns where they go in the
        step's window of W columns: the stream's last `tail` encoded frames (at most 9) end at
        column `lead`, the new frames start there (columns before `lead - tail` are zero: the
        causal zero padding); and how many of the copied samples are the signal's (`real`; the
        rest, past its end, count as zeros)."""
        g = self.geometry
        need = self.need
        if new > need or new < 1:
            raise ValueError(f"a step takes 1 to {need} frames, not {new}")
        lo = self.frames_taken * g.hop - g.half_window - 1  # padded-signal index of out[0]
        size = g.segment_samples(new)
        if self.raw or lo - self.origin + size > self.row.size:
            self._hold(lo, size)
        at = lo - self.origin
        out[:size] = self.row[at: at + size]
        tail = min(self.frames_taken, PRE_ENCODE_CACHE)
        self.frames_taken += new
        self.steps += 1
        self.full_at = self._samples_for_next_chunk()
        return g.window - need, tail, size if not self.ended else min(size, self.samples - lo)

    def _compact(self, keep_from: int) -> None:
        """Drop the row's samples before padded-signal index `keep_from`."""
        shift = keep_from - self.origin
        if shift > 0:
            self.row[: self.filled - shift] = self.row[shift: self.filled]
            self.origin, self.filled = keep_from, self.filled - shift

    def _hold(self, lo: int, size: int) -> None:
        """Make row cover padded samples [lo, lo + size) (those past the signal's end may be
        stale: `take` says how many are real): drop what precedes `lo` if it does not fit, then
        move queued pieces in."""
        if lo - self.origin + size > self.row.size:
            self._compact(lo)
        while self.raw and self.filled < self.row.size:
            piece = self.raw[0]
            room = self.row.size - self.filled
            if piece.size > room:
                self.row[self.filled:] = piece[:room]
                self.raw[0] = piece[room:]
                self.filled += room
            else:
                self.row[self.filled: self.filled + piece.size] = piece
                self.filled += piece.size
                self.raw.pop(0)

    def _samples_for_next_chunk(self) -> int:
        """Samples pushed at which the next step's frames all exist (before the end)."""
        return self.geometry.samples_for(self.frames_taken + self.need)
