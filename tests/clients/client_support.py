"""Helpers for client tests: what the daemon received, replaying it, finding a WAV inside it.

The fixture model's transcripts are gibberish that changes with any shift or resampling of the
audio, so a capture path (PulseAudio, a browser) cannot be checked against a file's reference
transcript. Instead the tests record what the daemon's engine received (:class:`PushRecorder`),
check that it is the played file (:func:`best_correlation`; :func:`share_heard` for a capture
that may glitch), and check that the client shows
exactly the finals that this audio gives when streamed again (:func:`replay_finals`).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import soundfile as sf

from conftest import FIXTURES
from streamd.clients.resume import ResumingStream
from streamd.server.app import App
from streamd.protocol import Final, Start

SPEECH = FIXTURES / "in3_espeak_sentence.wav"


class PushRecorder:
    """Records the 16 kHz float samples the daemon's engine gets, and when, until :meth:`stop`."""

    def __init__(self, app: App) -> None:
        self.engine = app.state.engine
        self.chunks: list[np.ndarray] = []
        self.times: list[float] = []  # time.monotonic() of each chunk
        original = self.engine.push

        def push(session: Any, samples: np.ndarray) -> None:
            self.chunks.append(samples.copy())
            self.times.append(time.monotonic())
            original(session, samples)

        self.engine.push = push  # type: ignore[method-assign]

    def samples(self) -> int:
        """Samples received so far."""
        return sum(len(c) for c in self.chunks)

    def stop(self) -> np.ndarray:
        """Stop recording (later streams are not recorded); return what was received."""
        del self.engine.push  # the class's method again
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)


async def replay_finals(url: str, samples: np.ndarray, cafile: str | None = None) -> list[Final]:
    """The non-empty finals that ``samples`` (16 kHz float) give as one stream."""
    pcm = samples.astype("<f4").tobytes()
    async with ResumingStream(url, Start(sample_rate=16000, encoding="f32le"), cafile) as session:
        for i in range(0, len(pcm), 6400):
            await session.send_audio(pcm[i:i + 6400])
        await session.stop()
        return [r async for r in session.results() if isinstance(r, Final) and r.text]


def speech(pad_s: float = 1.0) -> np.ndarray:
    """The fixture sentence (16 kHz int16) with ``pad_s`` of silence on both sides."""
    data, rate = sf.read(str(SPEECH), dtype="int16")
    pad = np.zeros(round(pad_s * rate), np.int16)
    return np.concatenate([pad, data, pad])


def best_correlation(haystack: np.ndarray, needle: np.ndarray) -> float:
    """The highest normalised cross-correlation of ``needle`` over ``haystack`` (1 = identical)."""
    needle = needle.astype(np.float64)
    haystack = haystack.astype(np.float64)
    if len(haystack) < len(needle):
        return 0.0
    n = 1 << (len(haystack) + len(needle)).bit_length()
    corr = np.fft.irfft(np.fft.rfft(haystack, n) * np.conj(np.fft.rfft(needle, n)), n)
    lags = len(haystack) - len(needle) + 1
    power = np.concatenate([[0.0], np.cumsum(haystack ** 2)])
    window = np.sqrt(np.maximum(power[len(needle):len(needle) + lags] - power[:lags], 1e-12))
    return float(np.max(corr[:lags] / (window * np.linalg.norm(needle))))


def share_heard(haystack: np.ndarray, needle: np.ndarray, piece_s: float = 0.5, rate: int = 16000) -> float:
    """The share of ``needle``'s voiced ``piece_s`` pieces found in ``haystack`` (best normalised
    correlation > 0.9 each): a capture that glitched once (a buffer dropped or repeated, as a
    browser's fake microphone may under load) still shows the file it played, a wrong rate or
    format shows none of it."""
    size = round(piece_s * rate)
    pieces = [needle[i:i + size] for i in range(0, len(needle) - size + 1, size)]
    loudest = max(float(np.abs(piece).max()) for piece in pieces)
    voiced = [piece for piece in pieces if np.abs(piece).max() > loudest / 10]
    return sum(best_correlation(haystack, piece) > 0.9 for piece in voiced) / len(voiced)
