"""Live log-mel features: the model's front end (`streamd.model.preprocessor.LogMel`) computed
incrementally, frame-identical to the offline pass. Mel frame i is centred on sample hop*i (160
at 16 kHz); it is ready once sample hop*i + n_fft/2 - 1 has arrived.

This is the reference incremental front end, one signal at a time. The engine computes the same
frames its own way, for a whole step at once (`SlotAudio.take`, `Recognizer._frames`: pre-emphasis
on the model's device); tests/engine/test_streaming.py holds the two equal.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from streamd.engine.types import frames_ready
from streamd.model.preprocessor import LogMel


class IncrementalLogMel:
    """Log-mel of a live signal pushed in arbitrary pieces, frame-identical to `LogMel` on the
    whole signal. Frame i is ready once sample 160*i + 255 has arrived; at the end of the signal
    the remaining frames use the same zero padding the offline STFT uses. CPU, float32.

    Two ways to use it: `push()` / `flush()` compute one stream's new frames; `feed()` then
    `take_segment()` only do numpy bookkeeping, and `logmel_many()` computes the frames of many
    streams' segments in one call."""

    def __init__(self, logmel: LogMel) -> None:
        self._logmel = logmel
        self._hop = logmel.dims.hop_length
        self._half = logmel.dims.n_fft // 2
        self._preemph = np.float32(logmel.dims.preemph)
        self._buf = np.zeros(self._half, dtype=np.float32)  # pre-emphasised, from sample `_start`
        self._start = -self._half
        self._last = np.float32(0.0)  # last raw sample, for pre-emphasis across pieces
        self._seen = 0  # raw samples pushed so far
        self._next = 0  # next frame index to emit
        self._flushed = False

    @property
    def samples_seen(self) -> int:
        return self._seen

    def feed(self, samples: np.ndarray) -> None:
        """Queue samples: (n,) float32 mono at the model rate (pre-emphasis only, no frames)."""
        if samples.size == 0:
            return
        x = np.ascontiguousarray(samples, dtype=np.float32)
        prev = np.concatenate([np.array([self._last], dtype=np.float32), x[:-1]])
        y = x - self._preemph * prev  # float32, rounded as the offline torch ops round
        if self._seen == 0:
            y[0] = x[0]
        self._last = x[-1]
        self._seen += x.size
        self._buf = np.concatenate([self._buf, y])

    def take_segment(self, final: bool = False) -> np.ndarray | None:
        """The padded samples of every frame ready now (of all remaining frames if `final`: the
        signal has ended), as a (S,) array whose full 512-sample frames at hop 160 are exactly
        those frames; None when there are none. Advances past them."""
        if final and not self._flushed:
            self._buf = np.concatenate([self._buf, np.zeros(2 * self._half, dtype=np.float32)])
            self._flushed = True
        upto = self._seen // self._hop if final else self.frames_for(self._seen, final=False)
        if upto <= self._next:
            return None
        lo = self._next * self._hop - self._half - self._start
        hi = (upto - 1) * self._hop + self._half - self._start
        seg = self._buf[lo:hi]
        self._next = upto
        keep_from = self._next * self._hop - self._half - self._start
        self._buf = self._buf[keep_from:]
        self._start += keep_from
        return seg

    def push(self, samples: np.ndarray) -> Tensor:
        """samples: (n,) float32 mono at the model rate. Returns new frames (n_mels, k)."""
        self.feed(samples)
        return self._frames(self.take_segment())

    def flush(self) -> Tensor:
        """Emit the frames left at the end of the signal (total = samples // hop)."""
        return self._frames(self.take_segment(final=True))

    def frames_for(self, samples: int, final: bool) -> int:
        """Frames this extractor emits in total once `samples` samples have been pushed (and
        flushed, if `final`): `frames_ready`."""
        return frames_ready(samples, final, self._hop, self._half)

    def _frames(self, seg: np.ndarray | None) -> Tensor:
        if seg is None:
            return torch.empty(self._logmel.dims.n_mels, 0)
        return torch.from_numpy(logmel_many(self._logmel, [seg])[0])


def logmel_many(logmel: LogMel, segments: list[np.ndarray]) -> list[np.ndarray]:
    """Frames of many `take_segment()` segments in one batched call (one STFT, one matmul) on
    `logmel`'s device, read back to the host.

    Returns, per segment, (n_mels, k) float32 with k = (len - n_fft) // hop + 1."""
    if not segments:
        return []
    d = logmel.dims
    counts = [(s.size - d.n_fft) // d.hop_length + 1 for s in segments]
    samples = torch.zeros((len(segments), max(s.size for s in segments)), dtype=torch.float32)
    for row, seg in zip(samples.numpy(), segments):
        row[: seg.size] = seg
    with torch.no_grad():
        mel = logmel.frames(samples.to(logmel.featurizer.fb.device)).cpu().numpy()
    return [mel[i, :, :k] for i, k in enumerate(counts)]
