"""The speech gate's CPU a stream-step as a front end's sessions use it: N streams each push one
chunk a step, then each asks about its newest frames (a token's window: 1 s before to 1.2 s after),
as a step's results reach them together. Noise: no frame is active, so every question needs the
analysis (speech would answer many from frames decided already). Old tree: each stream analyses
its own audio; new tree: the streams share one `ActivityBatch` (the first question analyses all).

    python gate_step_micro.py TREE [streams] [chunk_ms]
"""
import sys
import time

import numpy as np

sys.path.insert(0, sys.argv[1])
from streamd.audio import activity  # noqa: E402

n = int(sys.argv[2]) if len(sys.argv) > 2 else 700
chunk = 16 * (int(sys.argv[3]) if len(sys.argv) > 3 else 160)
rng = np.random.default_rng(0)
x = (rng.standard_normal(16000 * 10) * 0.1).astype(np.float32)
batched = hasattr(activity, "ActivityBatch")
for rep in range(5):
    batch = activity.ActivityBatch() if batched else None
    acts = [activity.Activity(16000, -70, 9, batch) if batched else activity.Activity(16000, -70, 9) for _ in range(n)]
    steps = 0
    t = time.process_time()
    for k in range(0, x.size - chunk + 1, chunk):
        for a in acts:
            a.push(x[k:k + chunk])
        end = (k + chunk) / 16000
        for a in acts:
            a.active(end - 1.0, end + 1.2)
            a.forget(end - 1.0)
        steps += 1
    dt = time.process_time() - t
    print(f"rep {rep} {'batched' if batched else 'per stream'}: {n} streams, {chunk // 16} ms chunks: "
          f"{dt / (n * steps) * 1e6:.1f} us a stream-step")
