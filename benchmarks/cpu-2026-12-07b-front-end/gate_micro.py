"""The speech gate's CPU a stream-second (200 streams of 100-ms pushes, 20 s of noise) at ANALYSE_S 0.5 and 1.2.

    python gate_micro.py TREE
"""
import sys, time, numpy as np
sys.path.insert(0, sys.argv[1])
from streamd.audio import activity
from streamd.audio.activity import Activity
rng = np.random.default_rng(0)
x = (rng.standard_normal(16000 * 20) * 0.1).astype(np.float32)
for rep in range(5):
    for s in (0.5, 1.2):
        activity.ANALYSE_S = s
        acts = [Activity(16000, -70, 9) for _ in range(200)]
        t = time.process_time()
        for k in range(0, x.size, 1600):
            for a in acts:
                a.push(x[k:k + 1600])
        for a in acts:
            a.active(19.9, 20)
        dt = time.process_time() - t
        print(rep, s, f"{dt / (200 * 20) * 1e6:.0f} us a stream-second")
