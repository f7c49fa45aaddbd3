"""Host time of one decoder call (graphs, FC-L random, bf16, 160 ms: 2 frames) and its parts."""
import cProfile, pstats, sys, time
sys.path[:0] = ["scripts", "."]
import numpy as np, torch
from bench_migration import random_model_file
from streamd.model.checkpoint import load_model
from streamd.engine.migration import placed_copy
from streamd.decoding.graphs import make_decoder

m = placed_copy(load_model(random_model_file()).model, torch.device("cuda"), torch.bfloat16)
dec = make_decoder(m, "auto", per_octave=4)
d = m.joint.enc.weight.shape[1] if hasattr(m.joint, "enc") else 512
for b in (32, 304):
    enc = torch.randn(b, 2, d, device="cuda", dtype=torch.bfloat16)
    lengths = torch.full((b,), 2, device="cuda", dtype=torch.long)
    hyps, st = dec(enc, lengths, None)
    for _ in range(3):
        hyps, st = dec(enc, lengths, st)
    torch.cuda.synchronize()
    inner = dec._last
    cap = inner._cap
    def t(fn, n=20):
        out = []
        for _ in range(n):
            torch.cuda.synchronize(); t0 = time.perf_counter(); fn(); out.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        return 1e3 * float(np.median(out))
    call = t(lambda: dec(enc, lengths, st))
    rep = t(lambda: inner._replay(cap))
    load = t(lambda: inner.ref.load(cap.loop, enc, lengths, st))
    res = t(lambda: inner.ref.results(cap.loop, b, 2))
    busy = []  # the call while the GPU is busy with earlier work (as in a pipelined step)
    for _ in range(10):
        x = torch.randn(4096, 4096, device="cuda"); [x @ x for _ in range(20)]
        t0 = time.perf_counter(); dec(enc, lengths, st); busy.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    print(f"batch {b} mode {inner._mode}: call {call:.2f} ms (GPU busy: {1e3*np.median(busy):.2f}); replay {rep:.2f}; load {load:.2f}; results {res:.2f}")
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20): dec(enc, lengths, st)
    pr.disable(); torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("cumulative").print_stats(18)
