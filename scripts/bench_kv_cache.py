#!/usr/bin/env python3
"""Engine step time with the key/value cache against NeMo's input cache (issue 29), A/B in one
process: two recognizers on one model, N streams each fed the same audio, stepped alternately,
so that load from other processes on a shared machine falls on both alike. Reports the median
step of each and checks that both give the same tokens.

    python scripts/bench_kv_cache.py --model streamd/assets/default-model.pt --chunk-ms 1120 --streams 96
    python scripts/bench_kv_cache.py --chunk-ms 160 --streams 16 --device cuda --dtype bf16   # random FastConformer-L
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import load  # noqa: E402

from streamd.decoding.graphs import EAGER, make_decoder  # noqa: E402
from streamd.engine.encoder_step import make_encoder_step  # noqa: E402
from streamd.engine.migration import placed_copy  # noqa: E402
from streamd.engine.placement import parse_device, parse_dtype  # noqa: E402
from streamd.engine.recognizer import Recognizer  # noqa: E402
from streamd.model.checkpoint import load_model  # noqa: E402

CHUNK_RC = {80: 0, 160: 1, 560: 6, 1120: 13}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model file (default: a random FastConformer-L, bench_model.make_model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--graphs", default="on", choices=("on", "off"))
    ap.add_argument("--chunk-ms", type=int, default=160, choices=sorted(CHUNK_RC))
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=8, help="steps of each layout, alternately, after 2 warm-up rounds")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from bench_model import random_model_file  # scripts/: torch and sentencepiece, as here

    loaded = load_model(args.model or random_model_file())
    att_context = loaded.model.dims.att_context_with_right(CHUNK_RC[args.chunk_ms])
    model = placed_copy(loaded.model, parse_device(args.device), parse_dtype(args.dtype))
    n, mode = args.streams, "auto" if args.graphs == "on" else EAGER
    recs = {kv: Recognizer(model, capacity=n, att_context=att_context,
                           search_factory=lambda m: make_decoder(m, mode, per_octave=4),
                           encoder_factory=lambda m: make_encoder_step(m, mode, n), kv_cache=kv)
            for kv in (True, False)}
    tone = np.frombuffer(load.tone_bursts(seconds=20.0).pcm, dtype="<i2").astype(np.float32) / 32768
    chunk = 160 * 8 * (recs[True].geometry.right + 1)
    start = [int(x) for x in np.random.default_rng(0).integers(0, tone.size - chunk, n)]
    streams = {kv: [rec.open() for _ in range(n)] for kv, rec in recs.items()}
    pos = {kv: list(start) for kv in recs}
    tokens: dict[bool, list[list[int]]] = {kv: [[] for _ in range(n)] for kv in recs}
    times: dict[bool, list[float]] = {True: [], False: []}
    for kv in recs:
        for s in streams[kv]:
            s.push_audio(tone[: 160 * 50])

    def step(kv: bool) -> float:
        for k, s in enumerate(streams[kv]):
            p = pos[kv][k] % (tone.size - chunk)
            s.push_audio(tone[p: p + chunk])
            pos[kv][k] += chunk
        t0 = time.perf_counter()
        results = recs[kv].step(streams[kv])
        dt = time.perf_counter() - t0
        for acc, r in zip(tokens[kv], results):
            acc.extend(r.tokens)
        return dt

    for r in range(2 + args.rounds):
        for kv in ((True, False) if r % 2 == 0 else (False, True)):
            dt = step(kv)
            if r >= 2:
                times[kv].append(dt)
    ms = {kv: 1000 * float(np.median(t)) for kv, t in times.items()}
    same = tokens[True] == tokens[False]
    print(f"{n} streams, {args.chunk_ms} ms chunks, {args.device} {args.dtype}, graphs {args.graphs}, "
          f"{torch.get_num_threads()} threads: median step, key/value cache {ms[True]:.1f} ms, "
          f"input cache {ms[False]:.1f} ms ({ms[False] / ms[True]:.2f}x); tokens {'identical' if same else 'DIFFER'}")
    print("  kv steps (ms):    " + " ".join(f"{1000 * t:.0f}" for t in times[True]))
    print("  input steps (ms): " + " ".join(f"{1000 * t:.0f}" for t in times[False]))
    if args.json:
        args.json.write_text(json.dumps({
            "model": str(args.model or "random FastConformer-L"), "streams": n, "chunk_ms": args.chunk_ms,
            "device": args.device, "dtype": args.dtype, "graphs": args.graphs, "threads": torch.get_num_threads(),
            "kv_step_ms": ms[True], "input_step_ms": ms[False], "tokens_identical": same,
            "kv_steps_ms": [1000 * t for t in times[True]], "input_steps_ms": [1000 * t for t in times[False]]},
            indent=1))


if __name__ == "__main__":
    main()
