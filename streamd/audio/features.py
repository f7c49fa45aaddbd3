"""Live log-mel features: the model's front end (`streamd.model.preprocessor.LogMel`) computed
incrementally, frame-identical to the offline pass. Mel frame i is centred on sample hop*i (160
at 16 kHz); it is ready once sample hop*i + n_fft/2 - 1 has arrived.

This is the reference incremental front end, one signal at a time. The engine computes the same
frames its own way, for a whole step at once (`Stream.take`, `Recognizer._frames`: pre-emphasis
on the model's device); tests/engine/test_streaming.py holds the two equal.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from streamd.model.preprocessor import LogMel


class IncrementalLogMel:
    """Log-mel of a live signal pushed in arbitrary pieces, frame-identical to `LogMel` on the
    whole signal. Frame i is ready once sample 160*i + 255 has arrived; at the end of the signal
    the remaining frames use the same zero padding the offline STFT uses. CPU, float32.

    Two ways to use it: `push()` / `flush()` compute one stream's new frames; `feed()` then
    `take_segment()` only do numpy bookkeeping, and `logmel_batch()` computes the frames of many
    streams' segments in one call, left on `logmel`'s device."""

    def __init__(self, logmel: LogMel) -> None:
        self._logmel = logmel
        self._hop = logmel.dims.hop_length
        self._half = logmel.dims.n_fft // 2
        self._preemph = np.float32(logmel.dims.preemph)
        # Pre-emphasised samples [_start, _start + _len) live in _buf[_off: _off + _len]; the
        # buffer is written in place and compacted only when it fills (a step's segment is a
        # view of it, valid until the next `feed`).
        self._buf = np.zeros(4 * self._half, dtype=np.float32)
        self._off, self._len = 0, self._half  # the centre padding: `half` zeros before sample 0
        self._start = -self._half
        self._last = np.float32(0.0)  # last raw sample, for pre-emphasis across pieces
        self._seen = 0  # raw samples pushed so far
        self._next = 0  # next frame index to emit
        self._flushed = False

    @property
    def samples_seen(self) -> int:
        return self._seen

    def feed(self, *pieces: np.ndarray) -> None:
        """Queue samples, one or more consecutive pieces: (n,) float32 mono at the model rate
        (pre-emphasis only, no frames). A few numpy calls however many pieces: the engine
        feeds every stream once per step."""
        n = sum(p.size for p in pieces)
        if n == 0:
            return
        y = self._room(n)
        if len(pieces) == 1:
            y[:] = pieces[0]
        else:
            np.concatenate(pieces, out=y)
        first, last = y[0], y[-1]
        # y[i] = x[i] - p * x[i-1], float32, rounded as the offline torch ops round; the first
        # sample of the signal is kept as it is (the previous one counts as 0).
        y[1:] -= self._preemph * y[:-1]
        y[0] = first - self._preemph * self._last
        self._last = last
        self._seen += n

    def _room(self, n: int) -> np.ndarray:
        """The next `n` cells of the buffer (counted in): compacted or grown as needed."""
        if self._off + self._len + n > self._buf.size:
            keep = self._buf[self._off: self._off + self._len]
            if self._len + n > self._buf.size // 2:
                grown = np.empty(2 * (self._len + n), dtype=np.float32)
                grown[: self._len] = keep
                self._buf = grown
            else:
                self._buf[: self._len] = keep  # a memmove: source and target may overlap
            self._off = 0
        at = self._off + self._len
        self._len += n
        return self._buf[at: at + n]

    def take_segment(self, final: bool = False) -> np.ndarray | None:
        """The padded samples of every frame ready now (of all remaining frames if `final`: the
        signal has ended), as a (S,) array whose full 512-sample frames at hop 160 are exactly
        those frames; None when there are none. Advances past them. The array is a view of the
        extractor's buffer: use it before the next `feed`."""
        if final and not self._flushed:
            self._room(2 * self._half)[:] = 0.0
            self._flushed = True
        upto = self._seen // self._hop if final else self.frames_for(self._seen, final=False)
        if upto <= self._next:
            return None
        lo = self._next * self._hop - self._half - self._start
        hi = (upto - 1) * self._hop + self._half - self._start
        seg = self._buf[self._off + lo: self._off + hi]
        self._next = upto
        keep_from = self._next * self._hop - self._half - self._start
        self._off += keep_from
        self._len -= keep_from
        self._start += keep_from
        return seg

    def push(self, samples: np.ndarray) -> Tensor:
        """samples: (n,) float32 mono at the model rate. Returns new frames (n_mels, k)."""
        self.feed(samples)
        return self._frames(self.take_segment())

    def flush(self) -> Tensor:
        """Emit the frames left at the end of the signal (total = samples // hop)."""
        return self._frames(self.take_segment(final=True))

    def samples_for(self, frames: int) -> int:
        """Samples needed before `frames` frames are ready (before the end of the signal)."""
        return 0 if frames <= 0 else (frames - 1) * self._hop + self._half

    def frames_for(self, samples: int, final: bool) -> int:
        """Frames this extractor emits in total once `samples` samples have been pushed (and
        flushed, if `final`): a frame needs its whole 512-sample window, and the offline count
        is samples // hop."""
        if final:
            return samples // self._hop
        if samples < self._half:
            return 0
        return min((samples - self._half) // self._hop + 1, samples // self._hop)

    def _frames(self, seg: np.ndarray | None) -> Tensor:
        if seg is None:
            return torch.empty(self._logmel.dims.n_mels, 0)
        return torch.from_numpy(logmel_many(self._logmel, [seg])[0])


def logmel_many(logmel: LogMel, segments: list[np.ndarray]) -> list[np.ndarray]:
    """Frames of many `take_segment()` segments in one batched call, read back to the host.

    Returns, per segment, (n_mels, k) float32 with k = (len - n_fft) // hop + 1."""
    if not segments:
        return []
    frames, counts = logmel_batch(logmel, segments)
    mel = frames.cpu().numpy()
    return [mel[i, :, :k] for i, k in enumerate(counts)]


def logmel_batch(logmel: LogMel, segments: Sequence[np.ndarray | None]) -> tuple[Tensor, list[int]]:
    """Frames of many `take_segment()` segments (None: no frames) in one batched call (one STFT,
    one matmul) on `logmel`'s device, left there: one copy of the samples, through pinned memory
    on a GPU, so the call queues its work and returns without waiting for the GPU.

    Returns frames (B, n_mels, max k) float32 (a row's columns past its k are not frames of it) and
    each segment's k = (len - n_fft) // hop + 1 (0 for None)."""
    d = logmel.dims
    device = logmel.featurizer.fb.device
    counts = [0 if s is None else (s.size - d.n_fft) // d.hop_length + 1 for s in segments]
    longest = max((s.size for s in segments if s is not None), default=0)
    if longest == 0:
        return torch.zeros((len(segments), d.n_mels, 0), device=device), counts
    # Written once, row by row (a row's cells past its segment only make frames nobody reads:
    # zeroed so that they stay finite).
    samples = torch.empty((len(segments), longest), dtype=torch.float32, pin_memory=device.type == "cuda")
    for row, seg in zip(samples.numpy(), segments):
        n = 0 if seg is None else seg.size
        row[:n] = seg
        row[n:] = 0.0
    with torch.no_grad():
        return logmel.frames(samples.to(device, non_blocking=True)), counts
