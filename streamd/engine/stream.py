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


@dataclass(slots=True)
class Stream:
    """Audio and frame bookkeeping of one stream; the engine owns its slot in the batched state
    (encoder and decoder state, and its last encoded mel frames).

    Samples live in `row` (the slot's row of the recognizer's sample array), used as a ring:
    position q of the padded signal (which has `half_window + 1` zeros before sample 0: the
    offline STFT's centre padding and the zero pre-emphasis reads before the first sample; q = 0
    is the first of them) is row[q % M]. Nothing is ever moved: a piece is written once, a step
    copies its samples out once (`take`, in at most two slices). The next step's first sample
    is at q = frames_taken * hop; everything before it may be overwritten, so a piece that does
    not fit in the rest of the ring waits in `raw` until a step has made room. A step whose
    samples the GPU copies from the ring itself (`take` without `out`) holds its positions until
    `release` (the copy has happened). Everything here is numpy: the engine thread must not spend
    a GIL release and re-acquire (a torch call) per stream, or a busy event loop stalls it (see
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
    need: int = 0  # new mel frames the next full step takes (`ChunkGeometry.new_frames`)
    full_at: int = 0  # samples that make the next full chunk (see `push_audio`)
    written: int = 0  # padded-signal positions written into `row` (the leading zeros, then samples)
    held: int = -1  # positions from here on are kept for a step's copy still to happen (-1: none)

    @classmethod
    def new(cls, slot: int, row: np.ndarray, geometry: ChunkGeometry) -> Stream:
        """A stream in a (reused) slot's row: its leading zeros are written here."""
        lead = geometry.half_window + 1
        row[:lead] = 0.0
        stream = cls(slot, row, geometry, need=geometry.new_frames(True), written=lead)
        stream.full_at = geometry.samples_for(stream.need)
        return stream

    def push_audio(self, samples: np.ndarray) -> bool:
        """samples: (n,) float32 mono at the model's sample rate, copied into the stream's row (or
        queued, when it does not fit yet). Returns whether a full chunk is pending now (`ready`,
        in one comparison: the engine asks per piece)."""
        n = samples.size
        if n:
            keep = self._keep_from(self.frames_taken * self.geometry.hop)
            if not self.raw and self.written + n - keep <= self.row.size:
                self._write(samples)
            else:
                self.raw.append(samples)
            self.samples += n
        return self.samples >= self.full_at

    def end(self) -> None:
        """No more audio: the remaining frames become a last, shorter step."""
        self.ended = True

    @property
    def frames_left(self) -> int:
        """Mel frames that exist (or will, once computed) and no step has taken yet."""
        return self.geometry.frames_for(self.samples, self.ended) - self.frames_taken

    @property
    def ready(self) -> bool:
        """A step can run: a full chunk is pending, or the stream ended with frames left."""
        if not self.ended:
            return self.samples >= self.full_at  # frames_left >= need, without counting frames
        return self.frames_left > 0

    @property
    def finished(self) -> bool:
        return self.ended and self.frames_left == 0

    def next_frames(self) -> int:
        """New mel frames the next step takes: `min(need, frames_left)` of a `ready` stream.

        Only up to the next step's frames: a client that sends far ahead of real time must not
        make one step (and every other stream's results) wait for its whole backlog."""
        if not self.ended and self.samples >= self.full_at:
            return self.need
        return min(self.need, self.frames_left)

    def take(self, new: int, out: np.ndarray | None) -> tuple[int, int, int]:
        """Consume the next `new` frames (`next_frames()`): copy their samples (`segment_samples`,
        from one sample before their first window on, at ring position q = frames_taken * hop
        before the call) into `out`; with `out` None, leave them in the ring for the caller to
        copy, held there until `release`. Returns where they go in the step's window of W
        columns: the stream's last `tail` encoded frames (at most 9) end at column `lead`, the
        new frames start there (columns before `lead - tail` are zero: the causal zero padding);
        and how many of the samples are the signal's (`real`; the rest, past its end or stale in
        the ring, count as zeros)."""
        g, need = self.geometry, self.need
        if new > need or new < 1:
            raise ValueError(f"a step takes 1 to {need} frames, not {new}")
        q = self.frames_taken * g.hop  # ring position of out[0]
        size = (new - 1) * g.hop + 2 * g.half_window + 1  # g.segment_samples(new)
        if self.raw:
            self._fill(q)
        if self.written < q + size and not self.ended:
            raise RuntimeError(f"stream {self.slot}: a step's samples are still queued (ring positions held by a "
                               "launch that was not released)")
        if out is None:
            self.held = self._keep_from(q)
        else:
            m = self.row.size
            at = q % m
            if at + size <= m:
                out[:size] = self.row[at: at + size]
            else:  # wraps around the ring's end
                out[: m - at] = self.row[at:]
                out[m - at: size] = self.row[: size - (m - at)]
        tail = min(self.frames_taken, PRE_ENCODE_CACHE)
        self.frames_taken += new
        self.steps += 1
        self.need = g.new_frames(False)
        self.full_at = g.samples_for(self.frames_taken + self.need)
        # q - lead is the padded-signal index of out[0] (sample 0 is at q = lead)
        real = size if not self.ended else min(size, self.samples - q + g.half_window + 1)
        return g.window - need, tail, real

    def release(self) -> None:
        """The copies of the ring's held positions have happened: they may be overwritten."""
        self.held = -1

    def _keep_from(self, q: int) -> int:
        """The first ring position that must not be overwritten, given that positions from q on
        are needed: q, or an earlier one still held."""
        return q if self.held < 0 else min(q, self.held)

    def _write(self, samples: np.ndarray) -> None:
        """Append samples to the ring (the caller checked that they fit)."""
        m, n = self.row.size, samples.size
        at = self.written % m
        if at + n <= m:
            self.row[at: at + n] = samples
        else:
            self.row[at:] = samples[: m - at]
            self.row[: n - (m - at)] = samples[m - at:]
        self.written += n

    def _fill(self, q: int) -> None:
        """Move queued pieces into the ring as far as they fit, keeping positions from q on
        (those past the signal's end may then be stale: `take` says how many are real)."""
        room = self.row.size - (self.written - self._keep_from(q))
        while self.raw and room > 0:
            piece = self.raw[0]
            if piece.size > room:
                self._write(piece[:room])
                self.raw[0] = piece[room:]
                room = 0
            else:
                self._write(piece)
                room -= piece.size
                self.raw.pop(0)
