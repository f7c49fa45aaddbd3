"""What a landed step of 10240 streams costs the engine item's thread: every row's `ChunkResult`
(what it made before) against one framed `Results` message a front end (what the daemon's engine
thread makes with 8 front ends: `bench_capacity.deliver`). Labels as the bench's random model
gives them (~0.3 a frame, 2 frames a 160-ms step). Run: python deliver_micro.py REPO"""
import sys
import time

import numpy as np

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/scripts")
import bench_capacity  # noqa: E402
from streamd.engine.types import EngineSession, StepResults  # noqa: E402

n = 10240
rng = np.random.default_rng(0)
lengths = rng.binomial(2, 0.3, n)
r = StepResults(rng.integers(0, 1024, (n, 3)), rng.integers(0, 1000, (n, 3)), lengths, np.arange(n), np.arange(n) + 2)
sessions = [EngineSession(id=i) for i in range(n)]
for name, f in [("chunks", r.chunks), ("deliver to 8 front ends", lambda: bench_capacity.deliver(r, sessions, 8))] * 2:
    ts = []
    for _ in range(20):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    print(f"{name}: median {1e3 * np.median(ts):.2f} ms of 20")
