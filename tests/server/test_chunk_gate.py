"""A front end holds a stream's audio until it completes the engine's next chunk (`ChunkGate`):
the engine then sees as many complete chunks, after every client message, as if it had got every
piece, and all the audio arrives, in order."""
from __future__ import annotations

import numpy as np
import pytest

from helpers import random_model
from streamd.audio.features import IncrementalLogMel
from streamd.engine.types import ChunkGeometry
from streamd.server.worker import ChunkGate


@pytest.mark.parametrize("right", [0, 1, 13])
def test_geometry_thresholds_are_those_of_the_live_features(right: int) -> None:
    """`ChunkGeometry.samples_for(f)` is the fewest samples after which f frames exist."""
    model = random_model()
    g = ChunkGeometry.of(model.dims, right)
    features = IncrementalLogMel(model.preprocessor)
    for frames in range(1, 200):
        n = g.samples_for(frames)
        assert features.frames_for(n, final=False) >= frames > features.frames_for(n - 1, final=False)


@pytest.mark.parametrize("right, piece_ms", [(0, 20), (1, 100), (13, 100), (13, 350)])
def test_the_gate_lets_audio_through_exactly_when_a_chunk_completes(right: int, piece_ms: int) -> None:
    model = random_model()
    g = ChunkGeometry.of(model.dims, right)
    features = IncrementalLogMel(model.preprocessor)

    def chunks(samples: int) -> int:
        """Full chunks among the frames of `samples` samples (the signal going on)."""
        frames, k = features.frames_for(samples, final=False), 0
        while g.frames_after(k + 1) <= frames:
            k += 1
        return k

    rng = np.random.default_rng(right)
    gate = ChunkGate(g)
    pushed, through = [], []
    for i in range(60):
        n = int(16 * piece_ms * rng.uniform(0.5, 1.5))
        piece = rng.standard_normal(n).astype(np.float32)
        pushed.append(piece)
        if (out := gate.push(piece)) is not None:
            through.append(out)
        sent = sum(p.size for p in through)
        assert chunks(sent) == chunks(sum(p.size for p in pushed)), i
    if (rest := gate.flush()) is not None:
        through.append(rest)
    assert gate.flush() is None
    np.testing.assert_array_equal(np.concatenate(through), np.concatenate(pushed))
    assert len(through) < len(pushed)  # fewer, larger pieces reach the engine
