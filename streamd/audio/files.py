"""Reading audio files for the CLI and clients (not used by the server)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr


class AudioFileError(ValueError):
    """The file cannot be read as audio."""


def unreadable(path: str | os.PathLike[str], error: Exception) -> str:
    """Why `path` could not be read as audio, in words, without the path (libsndfile says
    "System error" for a missing file and "Format not recognised" for an empty file or a directory)."""
    p = Path(path)
    if not p.exists():
        return "no such file"
    if p.is_dir():
        return "is a directory, not an audio file"
    if not os.access(p, os.R_OK):
        return "permission denied"
    if p.stat().st_size == 0:
        return "empty file (0 bytes)"
    why = str(error).split(": ", 1)[-1] if isinstance(error, sf.LibsndfileError) else str(error)
    return f"not an audio file soundfile can read (WAV, FLAC, OGG, MP3, ...): {why}"


def read_audio(path: str | os.PathLike[str], sample_rate: int) -> np.ndarray:
    """Any soundfile-readable file (WAV, FLAC, OGG, ...) as float32 mono at `sample_rate`.

    Raises:
        AudioFileError: it cannot be read; the message says why (`unreadable`).
    """
    try:
        data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (OSError, RuntimeError, sf.LibsndfileError) as e:
        raise AudioFileError(f"{path}: {unreadable(path, e)}") from e
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if sr != sample_rate:
        mono = soxr.resample(mono, sr, sample_rate, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)
