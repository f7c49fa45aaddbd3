#!/usr/bin/env python3
"""Old tree against new tree, one engine step at a time (issue 29's CPU acceptance): two worker
processes, one per source tree, each holding a `Recognizer` of N streams fed the same tone
bursts; the driver asks them for a step in turn (the order swapped every round), so that load
from other processes on a shared machine falls on both alike. Prints each tree's median step.

    python benchmarks/kv-cache-2026-12-03/ab_step.py /work/main /work/wt-29 --chunk-ms 1120 --streams 120
    python benchmarks/kv-cache-2026-12-03/ab_step.py OLD NEW --model /tmp/fcl.pt --chunk-ms 160 --streams 32

(/tmp/fcl.pt: `bench_migration.make_model('/tmp/fcl.pt', 1024)`, the random FastConformer-L.)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

WORKER = r'''
import sys, time, numpy as np, torch
sys.path.insert(0, "scripts")
import load
from streamd.engine.recognizer import Recognizer
from streamd.model.checkpoint import load_model
chunk_ms, n, threads, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(threads)
model = load_model(path).model
rc = {160: 1, 1120: 13}[chunk_ms]
rec = Recognizer(model, capacity=n, att_context=model.dims.att_context_with_right(rc))
tone = np.frombuffer(load.tone_bursts(seconds=20.0).pcm, dtype="<i2").astype(np.float32) / 32768
chunk = 16 * chunk_ms
pos = [int(x) for x in np.random.default_rng(0).integers(0, tone.size - chunk, n)]
streams = [rec.open() for _ in range(n)]
print("ready", flush=True)
for line in sys.stdin:
    for k, s in enumerate(streams):
        p = pos[k] % (tone.size - chunk)
        s.push_audio(tone[p: p + chunk])
        pos[k] += chunk
    t0 = time.perf_counter()
    rec.step([s for s in streams if s.ready])
    print(f"{1000 * (time.perf_counter() - t0):.1f}", flush=True)
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--chunk-ms", type=int, default=1120, choices=(160, 1120))
    ap.add_argument("--streams", type=int, default=120)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10, help="steps of each tree, after 2 warm-up steps")
    ap.add_argument("--model", default="streamd/assets/default-model.pt", help="model file (default: the default model)")
    args = ap.parse_args()
    procs = {}
    for name, tree in (("old", args.old), ("new", args.new)):
        env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(args.chunk_ms), str(args.streams), str(args.threads), args.model],
            cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for p in procs.values():
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    times: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(2 + args.rounds):
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            p = procs[name]
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("step\n")
            p.stdin.flush()
            ms = float(p.stdout.readline())
            if r >= 2:
                times[name].append(ms)
    for p in procs.values():
        assert p.stdin is not None
        p.stdin.close()
        p.wait()
    med = {k: float(np.median(v)) for k, v in times.items()}
    print(f"{args.model}: {args.streams} streams, {args.chunk_ms} ms chunks, {args.threads} threads: median step old "
          f"{med['old']:.0f} ms, new {med['new']:.0f} ms (old / new {med['old'] / med['new']:.2f})")
    for k, v in times.items():
        print(f"  {k}: " + " ".join(f"{t:.0f}" for t in v))


if __name__ == "__main__":
    main()
