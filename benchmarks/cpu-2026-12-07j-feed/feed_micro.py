"""The engine item's feed at 10240 streams x 160 ms, its two copies timed apart: gathering every stream's
chunk from the test signal (a fancy index of a sliding-window view), and `SlotAudio.push_many` copying
them into the rings (the daemon's engine thread does only the second, from a front end's message).

    python benchmarks/cpu-2026-12-07j-feed/feed_micro.py /work/main
"""
import sys
import time

import numpy as np

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
from streamd.engine.stream import SlotAudio  # noqa: E402
from streamd.engine.types import ChunkGeometry  # noqa: E402

g = ChunkGeometry(1, 8, 160, 16000, 256)  # right context 1: 160-ms chunks
n, chunk = 10240, 2560
m = 2 * g.segment_samples(g.new_frames(False)) + 16000
audio = SlotAudio(np.zeros((n, m), np.float32), g)
for s in range(n):
    audio.open(s)
tone = np.random.default_rng(0).standard_normal(16000 * 20).astype(np.float32)
windows = np.lib.stride_tricks.sliding_window_view(tone, chunk)
offsets = np.random.default_rng(1).integers(0, tone.size, n)
slots = np.arange(n, dtype=np.int64)
gathers, pushes = [], []
for _ in range(12):
    at = offsets % (tone.size - chunk)
    offsets += chunk
    t0 = time.perf_counter()
    samples = windows[at].reshape(-1)
    t1 = time.perf_counter()
    audio.push_many(slots, slots * chunk, np.full(n, chunk, np.int64), samples)
    t2 = time.perf_counter()
    audio.taken[:] = audio.samples // g.hop  # as if steps had taken it all: every piece fits its ring
    gathers.append(t1 - t0)
    pushes.append(t2 - t1)
print(f"{n} streams x {chunk} samples: gather {1e3 * np.median(gathers[2:]):.1f} ms, "
      f"push_many {1e3 * np.median(pushes[2:]):.1f} ms (medians of 10)")
