#!/usr/bin/env python3
"""The speech gate's CPU a stream-second, as a front end's session drives it at 160 ms steps:
100-ms audio messages pushed, and at every step two tokens asked about (a window from 1 s before
each to 1.2 s after, as `streamd.session.core` asks), then the frames before the last second
forgotten. Real speech, 20 streams side by side; CPU time (`time.process_time`).

    python benchmarks/front-end-cpu-2026-12-07/gate_cpu.py [TREE] [AUDIO_GLOB]

TREE (default: this checkout) is put first on the import path, to compare two trees.
"""
from __future__ import annotations

import glob
import sys
import time

import numpy as np
import soundfile as sf

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
from streamd.audio.activity import Activity  # noqa: E402

RATE, MESSAGE, STEP, STREAMS = 16000, 1600, 2560, 20
pattern = sys.argv[2] if len(sys.argv) > 2 else "../shared/data/real-speech/ls_test_other/*.ogg"
files = sorted(glob.glob(pattern))[:12]
if not files:
    sys.exit(f"no audio matches {pattern}: name some 16 kHz speech files")
audio = np.concatenate([sf.read(f, dtype="float32")[0] for f in files])


def run() -> float:
    """Microseconds of CPU a stream-second."""
    gates = [Activity(RATE, -70.0, 9.0) for _ in range(STREAMS)]
    t0, pos, step_end = time.process_time(), 0, STEP
    while pos + MESSAGE <= audio.size:
        for g in gates:
            g.push(audio[pos:pos + MESSAGE])
        pos += MESSAGE
        while step_end <= pos:
            t = step_end / RATE
            for g in gates:
                g.active(t - 0.12 - 1.0, t - 0.08 + 1.2)
                g.active(t - 0.04 - 1.0, t + 1.2)
                g.forget(t - 1.0)
            step_end += STEP
    return (time.process_time() - t0) / (STREAMS * audio.size / RATE) * 1e6


print(f"{audio.size / RATE:.0f} s of speech, {STREAMS} streams")
for _ in range(3):
    print(f"{run():.0f} us of CPU a stream-second")
