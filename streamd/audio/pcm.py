"""Per-stream PCM intake: raw bytes of any size in, float32 mono at the model's rate out.

Binary websocket frames need not align with samples: an incomplete trailing
sample frame (an odd byte of s16le, 1-3 bytes of f32le, or a partial
interleaved multi-channel frame) is carried to the next call, so splitting
the byte stream anywhere gives the same output. Channels are averaged to
mono; f32le samples outside [-1, 1] are clipped and NaN/inf is rejected;
other rates are resampled with a streaming soxr resampler (HQ).
CPU only, no torch.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
import soxr

from streamd.errors import UnsupportedAudio
from streamd.protocol import check_format

_DTYPES: dict[str, np.dtype[np.generic]] = {"s16le": np.dtype("<i2"), "f32le": np.dtype("<f4")}

Samples = npt.NDArray[np.float32]


class PcmDecoder:
    """Decode one stream's PCM bytes to float32 mono samples at ``model_rate``.

    Args:
        sample_rate: the client's rate in Hz.
        encoding: ``"s16le"`` or ``"f32le"``.
        channels: interleaved channels, averaged to mono.
        model_rate: the rate the model takes (its feature dims' ``sample_rate``).
    """

    def __init__(self, sample_rate: int, encoding: str, channels: int = 1, *, model_rate: int) -> None:
        check_format(sample_rate, encoding, channels)
        self.sample_rate = sample_rate
        self.encoding = encoding
        self.channels = channels
        self._dtype = _DTYPES[encoding]
        self._frame_bytes = self._dtype.itemsize * channels
        self._carry = b""
        self._frames = 0
        self._closed = False
        self._model_rate = model_rate
        self._resampler = (
            None if sample_rate == model_rate
            else soxr.ResampleStream(sample_rate, model_rate, 1, dtype="float32", quality="HQ"))

    @property
    def frames_received(self) -> int:
        """Complete sample frames (one sample per channel) decoded so far."""
        return self._frames

    @property
    def seconds_received(self) -> float:
        """Audio received so far, in seconds of input time."""
        return self._frames / self.sample_rate

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete sample frame waiting for the next call."""
        return len(self._carry)

    def feed(self, data: bytes) -> Samples:
        """Decode ``data`` (any length) and return the new samples at the model's rate, possibly none.

        Raises:
            UnsupportedAudio: the f32le data holds NaN or infinite samples.
            RuntimeError: called after :meth:`flush`.
        """
        if self._closed:
            raise RuntimeError("PcmDecoder.feed() after flush()")
        buf = self._carry + data if self._carry else data
        usable = len(buf) - len(buf) % self._frame_bytes
        self._carry = bytes(buf[usable:])
        samples = self._decode(buf, usable)
        self._frames += len(samples)
        if self._resampler is None or not len(samples):
            return samples
        resampled: Samples = self._resampler.resample_chunk(samples)
        return resampled

    def cut(self) -> Samples:
        """End an utterance here (``finalize``): return the resampler's held-back samples, so
        that all audio received so far comes out now, and resample what follows afresh (an
        incomplete sample frame is kept: it belongs to the next message)."""
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        tail: Samples = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        self._resampler = soxr.ResampleStream(self.sample_rate, self._model_rate, 1, dtype="float32", quality="HQ")
        return tail

    def flush(self) -> Samples:
        """End the stream: return the resampler's tail; an incomplete last frame is dropped."""
        if self._closed:
            raise RuntimeError("PcmDecoder.flush() called twice")
        self._closed = True
        self._carry = b""
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        tail: Samples = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        return tail

    def _decode(self, buf: bytes, usable: int) -> Samples:
        raw = np.frombuffer(buf, dtype=self._dtype, count=usable // self._dtype.itemsize)
        samples = raw.astype(np.float32)
        if self.encoding == "s16le":
            samples *= np.float32(1 / 32768)
        else:
            if not np.isfinite(samples).all():
                bad = int(np.flatnonzero(~np.isfinite(samples))[0]) // self.channels
                raise UnsupportedAudio(
                    f"f32le audio has a NaN or infinite sample at frame {self._frames + bad}")
            np.clip(samples, -1.0, 1.0, out=samples)
        if self.channels > 1:
            samples = samples.reshape(-1, self.channels).mean(axis=1, dtype=np.float32)
        return samples
