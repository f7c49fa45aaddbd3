"""Live streams' host-side state: their raw samples not yet framed, and what they have consumed.

Chunk geometry (mel frames of one hop, 10 ms at 16 kHz; encoder frames are S = 8 mel frames, 80
ms), derived from the model's dims: at right context R every step encodes a window of
W = 9 + S(R+1) mel frames and keeps R+1 encoder frames. A stream's first step takes 1 + SR new
frames, later steps S(R+1). The window's leading rows that precede the stream are masked as the
offline pass's causal zero padding, so streaming output is the offline output, chunk for chunk.
The last step takes whatever is left.

A stream holds no mel frames: a step takes the raw samples of the frames it consumes, for all
its streams, computes their pre-emphasis and frames in one call and assembles the windows where
the model is (`Recognizer.launch`). Every slot's samples and counters live in `SlotAudio`, as
arrays indexed by slot, so that the engine thread's work per step is a few numpy calls over all
its streams (`push_many`, `ready`, `next_frames`, `take_held`) rather than Python per stream;
`Stream` is one slot's handle, with the one-stream operations (`push_audio`, `take`): the
reference the batched ones are tested against, and what tests and the file decoder use.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamd.engine.types import ChunkGeometry
from streamd.model.dims import PRE_ENCODE_CACHE


class SlotAudio:
    """Every slot's samples and audio counters (arrays of `capacity` rows; the engine owns the
    rest of a slot's state: encoder and decoder state, and its last encoded mel frames).

    Samples live in `rows` (one row a slot), each used as a ring: position q of a stream's padded
    signal (which has `half_window + 1` zeros before sample 0: the offline STFT's centre padding
    and the zero pre-emphasis reads before the first sample; q = 0 is the first of them) is
    rows[slot, q % M]. Nothing is ever moved: a piece is written once, and a step copies its
    samples out once (`take`, in at most two slices) or leaves them for the device to copy from
    the ring itself (`take_held`), held until `release`. The next step's first sample is at
    q = taken * hop; everything before it (and before a held position) may be overwritten, so a
    piece that does not fit in the rest of the ring waits in `raw` until a step has made room.

    Counters per slot: `samples` pushed, `written` ring positions (the leading zeros, then
    samples), `taken` mel frames consumed by steps, `need` new frames the next full step takes,
    `full_at` samples that make the next full chunk, `held` (-1: none), `steps`, `ended`; and
    `decoded`, encoder frames its steps decoded (the recognizer counts them as steps land)."""

    def __init__(self, rows: np.ndarray, geometry: ChunkGeometry) -> None:
        self.rows, self.geometry = rows, geometry  # rows: (capacity, M) float32
        capacity = rows.shape[0]
        self.samples, self.written, self.taken = (np.zeros(capacity, np.int64) for _ in range(3))
        self.need, self.full_at, self.steps = (np.zeros(capacity, np.int64) for _ in range(3))
        self.decoded = np.zeros(capacity, np.int64)
        self.held = np.full(capacity, -1, np.int64)
        self.ended = np.zeros(capacity, bool)
        self._bytes = rows.reshape(-1).data.cast("B")  # the rows as one run of bytes (`push_many`)
        self.raw: dict[int, list[np.ndarray]] = {}  # slot -> audio not in its ring yet, in order
        self.queued = np.zeros(capacity, bool)  # slot in `raw`
        self._full_need = geometry.new_frames(False)

    def open(self, slot: int) -> None:
        """A new stream in `slot`: its counters reset, its leading zeros written."""
        g = self.geometry
        lead = g.half_window + 1
        self.rows[slot, :lead] = 0.0
        first = g.new_frames(True)
        self.samples[slot], self.written[slot], self.taken[slot] = 0, lead, 0
        self.need[slot], self.full_at[slot], self.steps[slot] = first, g.samples_for(first), 0
        self.held[slot], self.ended[slot], self.queued[slot] = -1, False, False
        self.decoded[slot] = 0
        self.raw.pop(slot, None)

    # -- many streams at once (the engine thread's path) ---------------------------------------
    def push_many(self, slots: np.ndarray, starts: np.ndarray, sizes: np.ndarray, samples: np.ndarray) -> np.ndarray:
        """Piece i is samples[starts[i]: starts[i] + sizes[i]] of the stream in slots[i] (float32
        mono at the model's rate; int64 arrays of one length): each copied into its ring, or
        queued (a copy) when it does not fit yet, as `push` would one by one; `samples` is not
        kept. Returns, per piece, whether its stream has a full chunk pending now (after all the
        pieces)."""
        samples = np.ascontiguousarray(samples, np.float32)  # (a no-op for a front end's message)
        for piece in _rounds(slots):  # a stream twice in one message: its pieces in turn
            self._push_distinct(slots[piece], starts[piece], sizes[piece], samples)
        return self.samples[slots] >= self.full_at[slots]

    def _push_distinct(self, slots: np.ndarray, starts: np.ndarray, sizes: np.ndarray, samples: np.ndarray) -> None:
        """`push_many` of pieces of distinct streams."""
        m = self.rows.shape[1]
        written = self.written[slots]
        fits = (written + sizes - self._keep_from(slots, self.taken[slots] * self.geometry.hop) <= m) \
            & ~self.queued[slots]
        fit = np.flatnonzero(fits)
        at, size, start = written[fit] % m, sizes[fit], starts[fit]
        first = np.minimum(size, m - at)  # before the ring's end; the rest wraps around to its start
        wraps = first < size
        # One memcpy a piece (two if it wraps), between byte memoryviews: a third of numpy
        # slicing's time ('f' and '=f' float32 views do not assign to each other, bytes always do).
        dst = np.concatenate([slots[fit] * m + at, slots[fit][wraps] * m])
        src = np.concatenate([start, (start + first)[wraps]])
        end = np.concatenate([start + first, (start + size)[wraps]])
        rows, data = self._bytes, samples.data.cast("B")
        for d, a, b in zip((4 * dst).tolist(), (4 * src).tolist(), (4 * end).tolist()):
            rows[d: d + b - a] = data[a: b]
        self.written[slots[fit]] += size
        if not fits.all():
            for slot, a, n in zip(slots[~fits].tolist(), starts[~fits].tolist(), sizes[~fits].tolist()):
                self._queue(slot, samples[a: a + n])
        self.samples[slots] += sizes

    def ready(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: a step can run (a full chunk is pending, or the stream ended with frames left)."""
        return np.where(self.ended[slots], self.frames_left(slots) > 0, self.samples[slots] >= self.full_at[slots])

    def frames_left(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: mel frames that exist (or will, once computed) and no step has taken yet."""
        g, samples = self.geometry, self.samples[slots]
        live = np.where(samples < g.half_window, 0,
                        np.minimum((samples - g.half_window) // g.hop + 1, samples // g.hop))
        return np.where(self.ended[slots], samples // g.hop, live) - self.taken[slots]  # `frames_ready`

    def finished(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: the stream ended and every frame of it was taken (`Stream.finished`)."""
        return self.ended[slots] & (self.frames_left(slots) == 0)

    def next_frames(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: new mel frames its next step takes (`Stream.next_frames`)."""
        need = self.need[slots]
        full = ~self.ended[slots] & (self.samples[slots] >= self.full_at[slots])
        return np.where(full, need, np.minimum(need, self.frames_left(slots)))

    def take_held(self, slots: np.ndarray, news: np.ndarray) -> np.ndarray:
        """`take(slot, new, None)` for every slot at once: each consumes its next news[i] frames
        (from `next_frames`), whose samples stay in its ring, held until `release`. Returns
        (b, 4) int64: lead, tail and real as `take` returns them, and the ring position of the
        segment's first sample."""
        g = self.geometry
        for slot in slots[self.queued[slots]].tolist():  # queued pieces first, as far as they fit
            self._fill(slot, int(self.taken[slot]) * g.hop)
        need, taken = self.need[slots], self.taken[slots]
        if ((news > need) | (news < 1)).any():
            raise ValueError(f"a step takes 1 to {need.tolist()} frames, not {news.tolist()}")
        q = taken * g.hop
        size = (news - 1) * g.hop + g.n_fft + 1  # g.segment_samples(news)
        ended = self.ended[slots]
        short = (self.written[slots] < q + size) & ~ended
        if short.any():
            raise RuntimeError(f"streams in slots {slots[short].tolist()}: a step's samples are still queued (ring "
                               "positions held by a launch that was not released)")
        self.held[slots] = self._keep_from(slots, q)
        out = np.empty((slots.size, 4), np.int64)
        out[:, 0] = g.window - need
        out[:, 1] = np.minimum(taken, PRE_ENCODE_CACHE)
        out[:, 2] = np.where(ended, np.minimum(size, self.samples[slots] - q + g.half_window + 1), size)
        out[:, 3] = q
        taken = taken + news
        self.taken[slots] = taken
        self.steps[slots] += 1
        self.need[slots] = self._full_need
        after = taken + self._full_need  # g.samples_for(after), after >= 1
        self.full_at[slots] = np.maximum((after - 1) * g.hop + g.half_window, after * g.hop)
        return out

    def release(self, slots: np.ndarray) -> None:
        """The copies of these slots' held positions have happened: they may be overwritten."""
        self.held[slots] = -1

    # -- one stream (the reference) ------------------------------------------------------------
    def push(self, slot: int, samples: np.ndarray) -> bool:
        """samples: (n,) float32 mono at the model's sample rate, copied into the slot's ring (or
        queued, when it does not fit yet). Returns whether a full chunk is pending now."""
        n = samples.size
        if n:
            keep = self._keep_one(slot, int(self.taken[slot]) * self.geometry.hop)
            if not self.queued[slot] and int(self.written[slot]) + n - keep <= self.rows.shape[1]:
                self._write(slot, samples)
            else:
                self._queue(slot, samples)
            self.samples[slot] += n
        return bool(self.samples[slot] >= self.full_at[slot])

    def take(self, slot: int, new: int, out: np.ndarray | None) -> tuple[int, int, int]:
        """Consume the slot's next `new` frames (`next_frames`): copy their samples
        (`segment_samples`, from one sample before their first window on, at ring position
        q = taken * hop before the call) into `out`; with `out` None, leave them in the ring for
        the caller to copy, held there until `release`. Returns where they go in the step's
        window of W columns: the stream's last `tail` encoded frames (at most 9) end at column
        `lead`, the new frames start there (columns before `lead - tail` are zero: the causal
        zero padding); and how many of the samples are the signal's (`real`; the rest, past its
        end or stale in the ring, count as zeros)."""
        g, need = self.geometry, int(self.need[slot])
        if new > need or new < 1:
            raise ValueError(f"a step takes 1 to {need} frames, not {new}")
        taken = int(self.taken[slot])
        q = taken * g.hop  # ring position of out[0]
        size = g.segment_samples(new)
        if self.queued[slot]:
            self._fill(slot, q)
        ended = bool(self.ended[slot])
        if self.written[slot] < q + size and not ended:
            raise RuntimeError(f"stream {slot}: a step's samples are still queued (ring positions held by a "
                               "launch that was not released)")
        if out is None:
            self.held[slot] = self._keep_one(slot, q)
        else:
            row, m = self.rows[slot], self.rows.shape[1]
            at = q % m
            if at + size <= m:
                out[:size] = row[at: at + size]
            else:  # wraps around the ring's end
                out[: m - at] = row[at:]
                out[m - at: size] = row[: size - (m - at)]
        self.taken[slot] = taken + new
        self.steps[slot] += 1
        self.need[slot] = self._full_need
        self.full_at[slot] = g.samples_for(taken + new + self._full_need)
        # q - lead is the padded-signal index of out[0] (sample 0 is at q = lead)
        real = size if not ended else min(size, int(self.samples[slot]) - q + g.half_window + 1)
        return g.window - need, min(taken, PRE_ENCODE_CACHE), real

    def _keep_from(self, slots: np.ndarray, q: np.ndarray) -> np.ndarray:
        """Per slot: the first ring position that must not be overwritten, given that positions
        from q on are needed: q, or an earlier one still held."""
        held = self.held[slots]
        return np.where(held < 0, q, np.minimum(q, held))

    def _keep_one(self, slot: int, q: int) -> int:
        held = int(self.held[slot])
        return q if held < 0 else min(q, held)

    def _queue(self, slot: int, samples: np.ndarray) -> None:
        """Keep a copy (the caller's buffer may be reused: a front end's `AudioPipe`)."""
        self.raw.setdefault(slot, []).append(np.array(samples, np.float32))
        self.queued[slot] = True

    def _write(self, slot: int, samples: np.ndarray) -> None:
        """Append samples to the slot's ring (the caller checked that they fit)."""
        row, m, n = self.rows[slot], self.rows.shape[1], samples.size
        at = int(self.written[slot]) % m
        if at + n <= m:
            row[at: at + n] = samples
        else:
            row[at:] = samples[: m - at]
            row[: n - (m - at)] = samples[m - at:]
        self.written[slot] += n

    def _fill(self, slot: int, q: int) -> None:
        """Move queued pieces into the ring as far as they fit, keeping positions from q on
        (those past the signal's end may then be stale: `take` says how many are real)."""
        raw = self.raw[slot]
        room = self.rows.shape[1] - (int(self.written[slot]) - self._keep_one(slot, q))
        while raw and room > 0:
            piece = raw[0]
            if piece.size > room:
                self._write(slot, piece[:room])
                raw[0] = piece[room:]
                room = 0
            else:
                self._write(slot, piece)
                room -= piece.size
                raw.pop(0)
        if not raw:
            del self.raw[slot]
            self.queued[slot] = False


@dataclass(slots=True, eq=False)
class Stream:
    """One live stream: its slot in `audio` (whose counters it reads and writes, one stream at
    a time), and what its steps decoded. After the recognizer closes it (`detach`: slot -1)
    only `tokens`, `times` and `frames_decoded` mean anything, as they were at the close."""

    slot: int
    audio: SlotAudio
    tokens: list[int] = field(default_factory=list)  # the whole transcript, if the recognizer keeps it
    times: list[int] = field(default_factory=list)
    _decoded: int = 0  # frames_decoded once detached

    @classmethod
    def new(cls, slot: int, audio: SlotAudio) -> Stream:
        """A stream in a (reused) slot of `audio`: its counters reset, its leading zeros written."""
        audio.open(slot)
        return cls(slot, audio)

    @property
    def geometry(self) -> ChunkGeometry:
        return self.audio.geometry

    @property
    def frames_decoded(self) -> int:
        """Encoder frames its steps decoded."""
        return int(self.audio.decoded[self.slot]) if self.slot >= 0 else self._decoded

    def detach(self) -> int:
        """Leave the slot (keeping `frames_decoded`); returns it."""
        slot, self._decoded = self.slot, self.frames_decoded
        self.slot = -1
        return slot

    @property
    def row(self) -> np.ndarray:
        """The slot's ring of samples."""
        return self.audio.rows[self.slot]

    @property
    def samples(self) -> int:
        return int(self.audio.samples[self.slot])

    @property
    def frames_taken(self) -> int:
        return int(self.audio.taken[self.slot])

    @property
    def steps(self) -> int:
        return int(self.audio.steps[self.slot])

    @property
    def ended(self) -> bool:
        return bool(self.audio.ended[self.slot])

    def push_audio(self, samples: np.ndarray) -> bool:
        """`SlotAudio.push`: whether a full chunk is pending now (`ready`, in one comparison)."""
        return self.audio.push(self.slot, samples)

    def end(self) -> None:
        """No more audio: the remaining frames become a last, shorter step."""
        self.audio.ended[self.slot] = True

    @property
    def frames_left(self) -> int:
        """Mel frames that exist (or will, once computed) and no step has taken yet."""
        return self.geometry.frames_for(self.samples, self.ended) - self.frames_taken

    @property
    def ready(self) -> bool:
        """A step can run: a full chunk is pending, or the stream ended with frames left."""
        a, slot = self.audio, self.slot
        if not a.ended[slot]:
            return bool(a.samples[slot] >= a.full_at[slot])  # frames_left >= need, without counting frames
        return self.frames_left > 0

    @property
    def finished(self) -> bool:
        return self.ended and self.frames_left == 0

    def next_frames(self) -> int:
        """New mel frames the next step takes: `min(need, frames_left)` of a `ready` stream.

        Only up to the next step's frames: a client that sends far ahead of real time must not
        make one step (and every other stream's results) wait for its whole backlog."""
        need = int(self.audio.need[self.slot])
        if not self.ended and self.samples >= self.audio.full_at[self.slot]:
            return need
        return min(need, self.frames_left)

    def take(self, new: int, out: np.ndarray | None) -> tuple[int, int, int]:
        """`SlotAudio.take` of this stream's slot."""
        return self.audio.take(self.slot, new, out)

    def release(self) -> None:
        """`SlotAudio.release` of this stream's slot."""
        self.audio.held[self.slot] = -1


def _rounds(slots: np.ndarray) -> list[np.ndarray | slice]:
    """The pieces of a message (slots: (n,) int64, a stream's slot per piece) as rounds in which
    no stream repeats: every stream's first piece, then every second one, and so on; the indices of
    each round in message order. One round (everything) when no stream repeats, the usual case."""
    order = np.argsort(slots, kind="stable")
    ordered = slots[order]
    first = np.ones(ordered.size, bool)
    first[1:] = ordered[1:] != ordered[:-1]
    if first.all():
        return [slice(None)]
    at = np.arange(ordered.size)
    rank = np.empty(ordered.size, np.int64)
    rank[order] = at - np.maximum.accumulate(np.where(first, at, 0))  # earlier pieces of the same stream
    return [np.flatnonzero(rank == r) for r in range(int(rank.max()) + 1)]
