"""push_many of 10240 chunks of 160 ms straight from a 256 MB source (bench_capacity since f57b0f8) against
from a buffer gathered before (e17eb9e). CPU only: python feed_source.py REPO"""
import sys, time
import numpy as np
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
from streamd.engine.stream import SlotAudio
from streamd.engine.types import ChunkGeometry
g = ChunkGeometry(1, 8, 160, 16000, 256)
n, chunk = 10240, 2560
m = 2 * g.segment_samples(g.new_frames(False)) + 16000
audio = SlotAudio(np.zeros((n, m), np.float32), g)
for s in range(n): audio.open(s)
tone = np.random.default_rng(0).standard_normal(16000 * 20).astype(np.float32)
source = np.tile(tone, -(-(64 << 20) // tone.size))
offsets = np.random.default_rng(1).integers(0, source.size - 1, n)
slots = np.arange(n, dtype=np.int64)
windows = np.lib.stride_tricks.sliding_window_view(tone, chunk)
o2 = np.random.default_rng(1).integers(0, tone.size, n)
direct, gathered = [], []
for _ in range(12):
    at = offsets % (source.size - chunk); offsets += chunk
    t0 = time.perf_counter()
    audio.push_many(slots, at, np.full(n, chunk, np.int64), source)
    direct.append(time.perf_counter() - t0)
    audio.taken[:] = audio.samples // g.hop
    a2 = o2 % (tone.size - chunk); o2 += chunk
    samples = windows[a2].reshape(-1)
    t0 = time.perf_counter()
    audio.push_many(slots, slots * chunk, np.full(n, chunk, np.int64), samples)
    gathered.append(time.perf_counter() - t0)
    audio.taken[:] = audio.samples // g.hop
print(f"push_many from a 256 MB source {1e3*np.median(direct[2:]):.1f} ms, from a gathered buffer {1e3*np.median(gathered[2:]):.1f} ms")
