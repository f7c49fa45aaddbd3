"""Host cost of a sparse step's copy from the rings: the old whole-ring gather against the
segment gather (`recognizer._gather_segments`), 1120-ms chunks of a FastConformer (8x subsampling)."""
import time, numpy as np, torch, sys
from streamd.engine import recognizer
torch.set_num_threads(1)
cap, full = 6000, 18319  # about the segment samples of a 1120-ms step (112 new mel frames)
L = 2 * full + max(full // 2, 4096)
rings = torch.zeros((cap, L)); rings.uniform_()
rng = np.random.default_rng(0)
for b in (100, 300):
    res = {"whole rings": [], "segments": []}
    src, out, order = torch.empty((b, L)), torch.empty((b, full)), np.empty(b, np.int64)
    src.zero_(); out.zero_()  # touched: reused buffers, as the pinned host allocator's are
    for rep in range(40):
        slots = np.sort(rng.choice(cap, b, replace=False)); at = rng.integers(0, 10**7, b)
        t = time.perf_counter(); torch.index_select(rings, 0, torch.from_numpy(slots), out=src)
        res["whole rings"].append(time.perf_counter() - t)
        t = time.perf_counter()
        recognizer._gather_segments(rings, slots, at, out, order); res["segments"].append(time.perf_counter() - t)
    print(b, {k: f"median {np.median(v)*1e3:.2f} ms" for k, v in res.items()})
