"""NeMo's log-mel front end, offline and incremental.

The pipeline (NeMo `FilterbankFeatures` at inference): pre-emphasis 0.97, STFT with a symmetric
Hann window of 400 samples centred in 512, `center=True` with zero padding, power spectrum,
Slaney mel filterbank, ln(x + 2^-24), no normalisation ("NA"), no dither. Mel frame i is centred
on sample 160*i; a signal of N samples has N // 160 frames.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from streamd.model.dims import FeatureDims

LOG_GUARD = 2.0**-24
LOG_MEL_SILENCE = math.log(LOG_GUARD)  # -16.635: the log-mel value of digital silence


def slaney_mel_filterbank(dims: FeatureDims) -> Tensor:
    """librosa's `filters.mel(htk=False, norm="slaney")` from 0 Hz to Nyquist: (n_mels, n_fft//2+1)."""
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0

    def hz_to_mel(f: float) -> float:
        return f / f_sp if f < min_log_hz else min_log_mel + math.log(f / min_log_hz) / logstep

    mels = np.linspace(hz_to_mel(0.0), hz_to_mel(dims.sample_rate / 2), dims.n_mels + 2)
    mel_f = np.where(mels >= min_log_mel, min_log_hz * np.exp(logstep * (mels - min_log_mel)), f_sp * mels)
    fft_f = np.linspace(0, dims.sample_rate / 2, dims.n_fft // 2 + 1)
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_f[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2:] - mel_f[:-2]))[:, None]
    return torch.from_numpy(weights.astype(np.float32))


class _Featurizer(nn.Module):
    """Holds the window and filterbank buffers under NeMo's names."""

    window: Tensor
    fb: Tensor

    def __init__(self, window: Tensor, fb: Tensor) -> None:
        super().__init__()
        self.register_buffer("window", window)
        self.register_buffer("fb", fb)


class LogMel(nn.Module):
    """Offline log-mel features; buffers `featurizer.window` [400] and `featurizer.fb` [1, M, 257]
    carry NeMo's state-dict names so a checkpoint's own window and filterbank are used."""

    def __init__(self, dims: FeatureDims) -> None:
        super().__init__()
        self.dims = dims
        self.featurizer = _Featurizer(torch.hann_window(dims.win_length, periodic=False),
                                      slaney_mel_filterbank(dims)[None])

    def frames(self, padded: Tensor) -> Tensor:
        """Log-mel of every full 512-sample frame of pre-emphasised, already padded audio.

        The mel projection is one 2-D float64 matmul over all rows' frames, so a frame's value does
        not depend on how many other frames or rows share the call (what makes the incremental and
        batched-incremental features equal the offline ones bitwise).

        Args:
            padded: (B, S) float32.
        Returns:
            (B, n_mels, (S - n_fft) // hop + 1) float32.
        """
        d = self.dims
        spec = torch.stft(padded, n_fft=d.n_fft, hop_length=d.hop_length, win_length=d.win_length,
                          window=self.featurizer.window.float(), center=False, return_complex=True)
        power = torch.view_as_real(spec).pow(2).sum(-1).sqrt().pow(2)  # (B, F, n)
        b, f, n = power.shape
        cols = power.transpose(0, 1).reshape(f, b * n)
        if b * n == 1:  # one column would take BLAS's gemv path, which rounds differently from gemm
            cols = cols.expand(f, 2)
        # In float64, rounded once to float32: BLAS kernels pick different blockings (and so
        # summation orders) for different column counts on some CPUs (AMD EPYC with MKL).
        mel = torch.log(torch.mm(self.featurizer.fb[0].double(), cols.double()).float() + LOG_GUARD)[:, : b * n]
        return mel.reshape(-1, b, n).transpose(0, 1)

    def forward(self, audio: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Args: audio (B, N) float, lengths (B,) int64 samples.
        Returns: mel (B, n_mels, max(lengths) // hop) float32 with frames past a row's length set
        to 0.0 (as NeMo pads), and mel lengths (B,) = lengths // hop. Always fp32 (no autocast)."""
        with torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
            return self._forward(audio, lengths)

    def _forward(self, audio: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        d = self.dims
        audio = audio.float()
        n = audio.shape[1]
        valid = torch.arange(n, device=audio.device)[None] < lengths[:, None]
        y = torch.cat([audio[:, :1], audio[:, 1:] - d.preemph * audio[:, :-1]], dim=1)
        y = y.masked_fill(~valid, 0.0)
        pad = d.n_fft // 2
        mel = self.frames(nn.functional.pad(y, (pad, pad)))
        mel_len = torch.div(lengths, d.hop_length, rounding_mode="floor")
        mel = mel[:, :, : n // d.hop_length]
        frame_valid = torch.arange(mel.shape[2], device=mel.device)[None] < mel_len[:, None]
        return mel.masked_fill(~frame_valid[:, None], 0.0), mel_len


class IncrementalLogMel:
    """Log-mel of a live signal pushed in arbitrary pieces, frame-identical to `LogMel` on the
    whole signal. Frame i is ready once sample 160*i + 255 has arrived; at the end of the signal
    the remaining frames use the same zero padding the offline STFT uses. CPU, float32.

    Two ways to use it: `push()` / `flush()` compute one stream's new frames; `feed()` then
    `take_segment()` only do numpy bookkeeping, and `logmel_many()` computes the frames of many
    streams' segments in one call (what the engine does every step)."""

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
    """Frames of many `take_segment()` segments in one batched call (one STFT, one matmul) on
    `logmel`'s device: one copy of the samples there, one copy of the frames back.

    Returns, per segment, (n_mels, k) float32 with k = (len - n_fft) // hop + 1."""
    if not segments:
        return []
    d = logmel.dims
    counts = [(s.size - d.n_fft) // d.hop_length + 1 for s in segments]
    batch = np.zeros((len(segments), max(s.size for s in segments)), dtype=np.float32)
    for row, seg in zip(batch, segments):
        row[: seg.size] = seg
    with torch.no_grad():
        mel = logmel.frames(torch.from_numpy(batch).to(logmel.featurizer.fb.device)).cpu().numpy()
    return [mel[i, :, :k] for i, k in enumerate(counts)]
