"""Reading audio files for the CLI and clients (not used by the server)."""
from __future__ import annotations

import os

import numpy as np
import soundfile as sf
import soxr


class AudioFileError(ValueError):
    """The file cannot be read as audio."""


def read_audio(path: str | os.PathLike[str], sample_rate: int) -> np.ndarray:
    """Any soundfile-readable file (WAV, FLAC, OGG, ...) as float32 mono at `sample_rate`."""
    try:
        data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, sf.LibsndfileError) as e:
        raise AudioFileError(f"{path}: {e}") from e
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if sr != sample_rate:
        mono = soxr.resample(mono, sr, sample_rate, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)
