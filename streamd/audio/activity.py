"""Where a stream's audio may hold speech: a cheap level test that keeps words out of non-speech.

Audio is cut into 20 ms frames. A frame's level is its power in the band where speech is loudest
(`BAND_HZ`: rumble, hum and hiss outside it weigh nothing), in dB relative to a full-scale
square wave. A frame is *active* when its level is at least `min_dbfs` and at least `rise_db` above the
stream's noise floor, the quietest frame of the `FLOOR_S` seconds before it. Silence is never
active, nor is steady noise or a steady tone at any level: their frames stay within a few dB of
their floor. Speech is: its level rises and falls by tens of dB between syllables, quiet or in
noise. A sound that starts (a fan, a tone) is active for up to `FLOOR_S`, until the floor
catches up.
"""
from __future__ import annotations

import math

import numpy as np

FRAME_S = 0.02
BAND_HZ = (250.0, 3500.0)
FLOOR_S = 1.5
# The most audio a stream keeps waiting for analysis (float32: 77 KB at 16 kHz): more than the
# longest chunk (1120 ms), so a stream whose session asks once a step is analysed once a step.
ANALYSE_S = 1.2
# The most frames (rows: a stream's last partial frame counts) one FFT call of a batch takes
# (`ActivityBatch`; a stream's frames are never split): ~28 streams of a 160-ms step, 4 of a
# 1120-ms one. Its arrays (~0.7 MB each) stay in a core's cache: 128 or 512 frames a call cost more
# on a 160-ms step, and one call for a whole step of a front end's streams (700 streams of 1120
# ms: 39,200 frames, 100 MB) more than a stream at a time (benchmarks/cpu-2026-12-07h-gate-batch).
BATCH_FRAMES = 256
_SILENT_DBFS = -200.0  # the level of digital silence (log of 0 kept finite)


class Activity:
    """The active frames of one stream's audio (float32 mono at `rate`, pushed in order); frames
    older than what `forget` was told are dropped.

    A push comes with every audio message of a stream, so it only keeps the samples: they are
    analysed when a frame is asked about (a session asks once an engine step), or once `ANALYSE_S`
    seconds are waiting, all frames at once: one FFT, band power and level, and the floor (a
    running minimum) from cumulative minima. Forgetting waits for the next analysis. The
    decisions do not depend on the pieces the audio came in. The active frames are a bytearray
    (one byte a frame, 1: active). `batch`: the streams analysed together (`ActivityBatch`; one
    thread's); by default this stream alone."""

    def __init__(self, rate: int, min_dbfs: float, rise_db: float, batch: ActivityBatch | None = None) -> None:
        self.rate, self.min_dbfs, self.rise_db = rate, min_dbfs, rise_db
        self.frame = round(rate * FRAME_S)
        self._window = round(FLOOR_S / FRAME_S)
        self._batch = batch if batch is not None else ActivityBatch()
        self._rest = np.zeros(0, np.float32)  # samples short of a frame
        self._waiting: list[np.ndarray] = []  # pushed, not analysed yet (non-empty: in the batch)
        self._waiting_size, self._analyse_size = 0, round(rate * ANALYSE_S)
        self._window_fn = np.hanning(self.frame)
        bins = np.fft.rfftfreq(self.frame, 1 / rate)
        band = np.flatnonzero((bins >= BAND_HZ[0]) & (bins <= BAND_HZ[1]))  # contiguous bins
        self._band = slice(int(band[0]), int(band[-1]) + 1)
        # a Hann-windowed full-scale square wave's power in the band sums to about this much
        self._scale = 2 / (np.sum(self._window_fn ** 2) * self.frame)
        # the levels (dB) of the last `_window` frames, before them +inf (no frame yet)
        self._recent = np.full(self._window, np.inf)
        self._active = bytearray()  # frames `_first`.. of the stream
        self._first = 0
        self._forget = 0  # frames before this one will not be asked about (`forget`)

    @property
    def frames(self) -> int:
        """Frames seen so far."""
        self._analyse()
        return self._first + len(self._active)

    def push(self, samples: np.ndarray) -> None:
        if not self._waiting:
            self._batch.add(self)
        self._waiting.append(samples.astype(np.float32))  # a copy: kept for later
        self._waiting_size += samples.size
        if self._waiting_size >= self._analyse_size:
            self._analyse()

    def _analyse(self) -> None:
        """Decide the whole frames of the samples waiting (the batch's, this stream's among them);
        drop the forgotten ones."""
        if self._waiting:
            self._batch.analyse()  # drops each analysed stream's forgotten frames, this one's among them
        else:
            self._drop_forgotten()

    def _drop_forgotten(self) -> None:
        drop = min(self._forget, self._first + len(self._active)) - self._first
        if drop > 0:
            del self._active[:drop]
            self._first += drop

    def active(self, start_s: float, end_s: float) -> bool:
        """Whether any frame overlapping [start_s, end_s) seconds of the stream is active.

        A frame's decision never changes once made (it depends on the frames before it only), so
        an active frame among those decided answers without analysing the audio waiting: in
        speech, most asks."""
        a, b = int(start_s / FRAME_S), math.ceil(end_s / FRAME_S)
        if self._decided(a, b):
            return True
        if not self._waiting:
            return False
        self._analyse()
        return self._decided(a, b)

    def _decided(self, a: int, b: int) -> bool:
        """Whether any frame of frames [a, b) decided so far and not forgotten is active."""
        first = max(self._first, self._forget)
        return self._active.find(1, max(a, first) - self._first, max(b, first) - self._first) >= 0

    def forget(self, before_s: float) -> None:
        """Frames that end before `before_s` will not be asked about again (dropped at the next
        analysis: a step whose tokens need no decision analyses nothing)."""
        self._forget = max(self._forget, int(before_s / FRAME_S))


class ActivityBatch:
    """The streams of one thread (a front end's event loop) whose audio waits for analysis: a
    question to any of them analyses them all (`analyse`). A step's results reach a front end's
    streams together and each asks about its own frames, so the first question analyses the step's
    audio of every stream: FFT calls of `BATCH_FRAMES` frames, then the floors and decisions of
    the streams with as many new frames as each other in a few numpy calls for all, not a dozen
    numpy calls a stream. The decisions are each stream's alone. A stream that has ended stays until
    the next analysis (with its samples: at most `ANALYSE_S`). Not for several threads."""

    def __init__(self) -> None:
        self._members: dict[Activity, None] = {}  # with samples waiting, in the order they came

    def __len__(self) -> int:
        return len(self._members)

    def add(self, activity: Activity) -> None:
        self._members[activity] = None

    def analyse(self) -> None:
        """Decide the whole frames of every member's waiting samples, and drop each one's
        forgotten frames (a stream whose questions the others' answer analyses nothing itself);
        they leave the batch."""
        groups: dict[tuple[int, int], list[list[Activity]]] = {}
        frames: dict[tuple[int, int], int] = {}
        for a in self._members:  # streams of one rate share the FFT's frame, window and band
            key, n = (a.rate, a.frame), -(-(a._rest.size + a._waiting_size) // a.frame)  # rows: frames begun
            if key not in groups or frames[key] + n > BATCH_FRAMES:  # a new group once it is full
                groups.setdefault(key, []).append([])
                frames[key] = 0
            groups[key][-1].append(a)
            frames[key] += n
        self._members.clear()
        for group in (g for of_rate in groups.values() for g in of_rate):
            _decide(group, _levels(group))
            for a in group:
                a._drop_forgotten()


def _levels(group: list[Activity]) -> list[np.ndarray]:
    """Each stream's levels (dB, (n_i,)) of the whole frames of its rest and waiting samples, in
    one FFT for all (the group's streams share a rate); what is short of a frame is its new rest.
    Each stream's samples are laid out from a frame's start, its last partial frame padded with
    zeros: the frames are rows of one array (no gathering copy), and a padded row's level is not used."""
    first, frame = group[0], group[0].frame
    sizes = [a._rest.size + a._waiting_size for a in group]
    if max(sizes) < frame:  # no whole frame: all is rest
        for a in group:
            a._rest = np.concatenate([a._rest, *a._waiting])
            a._waiting.clear()
            a._waiting_size = 0
        return [np.zeros(0)] * len(group)
    pad = np.zeros(frame - 1, np.float32)
    x = np.concatenate([piece for a, size in zip(group, sizes) for piece in (a._rest, *a._waiting, pad[:-size % frame])])
    rows = x.reshape(-1, frame)
    spectrum = np.fft.rfft(rows * first._window_fn, axis=1)
    power = np.abs(spectrum[:, first._band])
    power **= 2
    power = power.sum(axis=1) * first._scale
    level = np.maximum(10 * np.log10(np.maximum(power, 1e-30)), _SILENT_DBFS)
    levels, row = [], 0
    for a, size in zip(group, sizes):
        n = size // frame
        a._rest = x[(row + n) * frame:row * frame + size].copy()
        a._waiting.clear()
        a._waiting_size = 0
        levels.append(level[row:row + n])
        row += -(-size // frame)
    return levels


def _decide(group: list[Activity], levels: list[np.ndarray]) -> None:
    """Decide each stream's frames of `levels` in blocks of at most `_window` frames, in order;
    the blocks of one round that are as long as each other together (`_decide_blocks`)."""
    w = group[0]._window
    for r in range(0, max(lv.size for lv in levels), w):
        by_size: dict[int, list[tuple[Activity, np.ndarray]]] = {}
        for a, lv in zip(group, levels):
            if lv.size > r:
                block = lv[r:r + w]
                by_size.setdefault(block.size, []).append((a, block))
        for pairs in by_size.values():
            _decide_blocks([a for a, _ in pairs], np.stack([block for _, block in pairs]))


def _decide_blocks(streams: list[Activity], level: np.ndarray) -> None:
    """Decide the next m frames of each stream, of levels `level` (dB, (G, m), m <= `_window`):
    each frame's floor is the quietest of the `_window` frames before it (none: itself), the
    minimum of a suffix of the stream's `_recent` and a prefix of its row."""
    m = level.shape[1]
    recent = np.stack([a._recent for a in streams])  # (G, window)
    floor = np.minimum.accumulate(recent[:, ::-1], axis=1)[:, ::-1][:, :m]
    np.minimum(floor[:, 1:], np.minimum.accumulate(level, axis=1)[:, :-1], out=floor[:, 1:])
    first = np.isinf(floor[:, 0])  # the stream's first frame
    floor[first, 0] = level[first, 0]
    limits = np.array([(a.min_dbfs, a.rise_db) for a in streams])  # (G, 2)
    active = (level >= limits[:, :1]) & (level >= floor + limits[:, 1:])
    recent = np.concatenate([recent[:, m:], level], axis=1)
    for a, row, kept in zip(streams, active.astype(np.uint8), recent):
        a._active += row.tobytes()
        a._recent = kept
