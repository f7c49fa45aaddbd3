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
_SILENT_DBFS = -200.0  # the level of digital silence (log of 0 kept finite)


class Activity:
    """The active frames of one stream's audio (float32 mono at `rate`, pushed in order); frames
    older than what `forget` was told are dropped.

    A push comes with every audio message of a stream, so it only keeps the samples: they are
    analysed when a frame is asked about (a session asks once an engine step), or once `ANALYSE_S`
    seconds are waiting, all frames at once: one FFT, band power and level, and the floor (a
    running minimum) from cumulative minima. Forgetting waits for the next analysis. The
    decisions do not depend on the pieces the audio came in. The active frames are a bytearray
    (one byte a frame, 1: active)."""

    def __init__(self, rate: int, min_dbfs: float, rise_db: float) -> None:
        self.rate, self.min_dbfs, self.rise_db = rate, min_dbfs, rise_db
        self.frame = round(rate * FRAME_S)
        self._window = round(FLOOR_S / FRAME_S)
        self._rest = np.zeros(0, np.float32)  # samples short of a frame
        self._waiting: list[np.ndarray] = []  # pushed, not analysed yet
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
        self._waiting.append(samples.astype(np.float32))  # a copy: kept for later
        self._waiting_size += samples.size
        if self._waiting_size >= self._analyse_size:
            self._analyse()

    def _analyse(self) -> None:
        """Decide the whole frames of the samples waiting; drop the forgotten ones."""
        if self._waiting:
            self._decide()
        drop = min(self._forget, self._first + len(self._active)) - self._first
        if drop > 0:
            del self._active[:drop]
            self._first += drop

    def _decide(self) -> None:
        x = np.concatenate([self._rest, *self._waiting])
        self._waiting.clear()
        self._waiting_size = 0
        n = x.size // self.frame
        self._rest = x[n * self.frame:].copy()
        if n == 0:
            return
        spectrum = np.fft.rfft(x[: n * self.frame].reshape(n, self.frame) * self._window_fn, axis=1)
        power = np.abs(spectrum[:, self._band])
        power **= 2
        power = power.sum(axis=1) * self._scale
        level = np.maximum(10 * np.log10(np.maximum(power, 1e-30)), _SILENT_DBFS)
        for start in range(0, n, self._window):
            self._decide_block(level[start:start + self._window])

    def _decide_block(self, level: np.ndarray) -> None:
        """Decide frames of levels `level` (dB, (m,), m <= `_window`): each one's floor is the
        quietest of the `_window` frames before it (none: itself), the minimum of a suffix of
        `_recent` and a prefix of `level`."""
        m = level.size
        floor = np.minimum.accumulate(self._recent[::-1])[::-1][:m]
        np.minimum(floor[1:], np.minimum.accumulate(level)[:-1], out=floor[1:])
        if floor[0] == np.inf:  # the stream's first frame
            floor[0] = level[0]
        active = (level >= self.min_dbfs) & (level >= floor + self.rise_db)
        self._active += active.astype(np.uint8).tobytes()
        self._recent = np.concatenate([self._recent[m:], level])

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
