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

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

FRAME_S = 0.02
BAND_HZ = (250.0, 3500.0)
FLOOR_S = 1.5
_SILENT_DBFS = -200.0  # the level of digital silence (log of 0 kept finite)


class Activity:
    """The active frames of one stream's audio (float32 mono at `rate`, pushed in order); frames
    older than what `forget` was told are dropped."""

    def __init__(self, rate: int, min_dbfs: float, rise_db: float) -> None:
        self.rate, self.min_dbfs, self.rise_db = rate, min_dbfs, rise_db
        self.frame = round(rate * FRAME_S)
        self._window = round(FLOOR_S / FRAME_S)
        self._rest = np.zeros(0, np.float32)  # samples short of a frame
        self._window_fn = np.hanning(self.frame)
        bins = np.fft.rfftfreq(self.frame, 1 / rate)
        self._band = (bins >= BAND_HZ[0]) & (bins <= BAND_HZ[1])
        # a Hann-windowed full-scale square wave's power in the band sums to about this much
        self._scale = 2 / (np.sum(self._window_fn ** 2) * self.frame)
        self._levels = np.zeros(0)  # levels of the last `_window` frames
        self._active = np.zeros(0, bool)  # frames `_first`.. of the stream
        self._first = 0

    @property
    def frames(self) -> int:
        """Frames seen so far."""
        return self._first + self._active.size

    def push(self, samples: np.ndarray) -> None:
        x = np.concatenate([self._rest, samples.astype(np.float32, copy=False)])
        n = x.size // self.frame
        self._rest = x[n * self.frame:]
        if n == 0:
            return
        spectrum = np.fft.rfft(x[: n * self.frame].reshape(n, self.frame) * self._window_fn, axis=1)
        power = np.sum(np.abs(spectrum[:, self._band]) ** 2, axis=1) * self._scale
        level = np.maximum(10 * np.log10(np.maximum(power, 1e-30)), _SILENT_DBFS)
        # the floor of each new frame: the quietest of the `_window` frames before it (none: itself)
        before = np.concatenate([np.full(self._window - self._levels.size, np.inf), self._levels, level])
        floor = sliding_window_view(before, self._window)[:n].min(axis=1)
        floor = np.where(np.isinf(floor), level, floor)
        active = (level >= self.min_dbfs) & (level >= floor + self.rise_db)
        self._levels = before[-self._window:]
        self._levels = self._levels[np.isfinite(self._levels)]
        self._active = np.concatenate([self._active, active])

    def active(self, start_s: float, end_s: float) -> bool:
        """Whether any frame overlapping [start_s, end_s) seconds of the stream is active."""
        a = max(int(start_s / FRAME_S), self._first) - self._first
        b = max(int(np.ceil(end_s / FRAME_S)), self._first) - self._first
        return bool(self._active[a:b].any())

    def forget(self, before_s: float) -> None:
        """Frames that end before `before_s` will not be asked about again."""
        drop = min(int(before_s / FRAME_S), self.frames) - self._first
        if drop > 0:
            self._active = self._active[drop:]
            self._first += drop
