"""NeMo's log-mel front end (`AudioToMelSpectrogramPreprocessor` at inference), the model's
`preprocessor`: its window and filterbank are checkpoint buffers.

The pipeline (NeMo `FilterbankFeatures`): pre-emphasis 0.97, STFT with a symmetric Hann window of
400 samples centred in 512, `center=True` with zero padding, power spectrum, Slaney mel
filterbank, ln(x + 2^-24), no normalisation ("NA"), no dither. Mel frame i is centred on sample
hop*i (160 at 16 kHz); a signal of N samples has N // hop frames. Live streams compute the same
frames incrementally (`streamd.audio.features`).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from streamd.model.dims import FeatureDims

LOG_GUARD = 2.0**-24


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
