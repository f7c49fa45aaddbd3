#!/usr/bin/env python3
"""Where one engine step's time goes (issue 13, item 1): N streams that all have a chunk ready,
stepped by the daemon's `Recognizer` under cProfile, summed by phase.

Phases: features (each stream's queued audio to the batched log-mel), window assembly, the
encoder step, the decoder, results (labels read back, per-stream bookkeeping). On a GPU the step
synchronises once, when the labels are read back: GPU time shows up in the phase that waits
for it (`Launched.collect`), so the report also times the same steps without the profiler.

    python scripts/profile_engine_step.py --device cuda --dtype bf16 --chunk-ms 160 --streams 1792
    python scripts/profile_engine_step.py --model M.pt --device cpu --dtype fp32 --streams 160 --graphs off
    python scripts/profile_engine_step.py --graphs off --kernels 30   # + the GPU kernels that take the time
    python scripts/profile_engine_step.py --cache input   # NeMo's input cache instead of keys and values
    python scripts/profile_engine_step.py --streams 4096 --vary 100:500   # as the daemon steps: a
        # different number of streams each step (its streams' slots spread over all 4096)
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
import warnings
from pathlib import Path
from typing import Any

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
PHASES = {
    "features (Stream.take, Recognizer._frames)": ("stream.py:take", "recognizer.py:_frames"),
    "windows (_layout, _windows)": ("recognizer.py:_layout", "recognizer.py:_windows"),
    "encoder step (launch or replay)": ("encoder_step.py:__call__",),
    "decoder (launch or replay)": ("greedy.py:__call__", "graphs.py:__call__"),
    "labels read back (waits for the GPU)": ("recognizer.py:collect",),
    "results (per-stream bookkeeping)": ("recognizer.py:results",),
    "slot state (index_select / index_copy)": ("state.py:index_select", "state.py:index_copy_"),
}


class _Synced:
    """Stands in for a step's callable: waits for the GPU before and after each call, so the
    wall time of the call is its GPU time (attributes pass through to the wrapped object)."""

    def __init__(self, wrapped: Any, times: list[float]) -> None:
        self._wrapped, self._times = wrapped, times

    def __call__(self, *args: Any, **kw: Any) -> Any:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = self._wrapped(*args, **kw)
        torch.cuda.synchronize()
        self._times.append(time.perf_counter() - t0)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


def gpu_phases(rec: Recognizer, step: Any, steps: int) -> dict[str, float]:
    """Milliseconds per step of the batched features, the encoder step and the decoder, each
    synchronised on its own (a separate pass: the GPU's share of each phase)."""
    times: dict[str, list[float]] = {"features (Recognizer._frames)": [], "encoder step": [], "decoder": []}
    names = list(times)
    enc, search = rec.encoder_step, rec.search
    rec.encoder_step = _Synced(enc, times[names[1]])  # type: ignore[assignment]
    rec.search = _Synced(search, times[names[2]])  # type: ignore[assignment]
    rec._frames = _Synced(rec._frames, times[names[0]])  # type: ignore[method-assign]
    try:
        for _ in range(steps):
            step()
    finally:
        rec.encoder_step, rec.search = enc, search
        del rec._frames  # the class's method again
    return {k: 1000 * float(np.median(v)) for k, v in times.items() if v}


def sync_points(step: Any) -> list[str]:
    """Where one step makes the host wait for the GPU, as PyTorch's sync debug mode sees it
    (file:line of each synchronising call; launches of our own conditional graphs are not seen)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    seen: dict[str, int] = {}
    for w in caught:
        where = f"{Path(w.filename).name}:{w.lineno}: {str(w.message).splitlines()[0][:80]}"
        seen[where] = seen.get(where, 0) + 1
    return [f"{n:4d} x {where}" for where, n in seen.items()]


def kernel_table(step: Any, steps: int, rows: int) -> str:
    """torch.profiler over `steps` steps: the `rows` operators and kernels with the most GPU time
    of their own (run with graphs off: a graph replay hides the kernels it launches)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return str(prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=70))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model file (default: a random FastConformer-L, bench_model.make_model)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--graphs", default="on", choices=("on", "off"))
    ap.add_argument("--chunk-ms", type=int, default=160, choices=sorted(CHUNK_RC))
    ap.add_argument("--streams", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--features", default="model", choices=("model", "cpu"),
                    help="where a step's log-mel frames are computed (default: the model's device)")
    ap.add_argument("--cache", default="kv", choices=("kv", "input"),
                    help="the slot caches' layout: each layer's keys and values (default) or NeMo's "
                         "normalised attention inputs (each step projects every cached frame again)")
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="also print the N operators and kernels with the most GPU time (torch.profiler)")
    ap.add_argument("--vary", metavar="LO:HI",
                    help="each step steps a random LO..HI of the streams (its own batch size each step, "
                         "as the daemon's steps), not all of them")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from bench_model import random_model_file  # scripts/: torch and sentencepiece, as here

    loaded = load_model(args.model or random_model_file())
    att_context = loaded.model.dims.att_context_with_right(CHUNK_RC[args.chunk_ms])
    model = placed_copy(loaded.model, parse_device(args.device), parse_dtype(args.dtype))
    n = args.streams
    mode = "auto" if args.graphs == "on" else EAGER
    rec = Recognizer(model, capacity=n, att_context=att_context,
                     search_factory=lambda m: make_decoder(m, mode, per_octave=4),
                     encoder_factory=lambda m: make_encoder_step(m, mode, n), features=args.features,
                     kv_cache=args.cache == "kv")
    lo, hi = (int(x) for x in args.vary.split(":")) if args.vary else (n, n)
    if args.vary:  # the graphs of every bucket up to HI, as the daemon captures them when it starts
        rec.capture_graphs(hi)
    tone = np.frombuffer(load.tone_bursts(seconds=20.0).pcm, dtype="<i2").astype(np.float32) / 32768
    streams = [rec.open() for _ in range(n)]
    chunk = 160 * 8 * (rec.geometry.right + 1)
    pos = [int(x) for x in np.random.default_rng(0).integers(0, tone.size - chunk, n)]
    for s in streams:  # one chunk ahead, as a real-time client is (more would wait outside the rings)
        s.push_audio(tone[:chunk])

    rng = np.random.default_rng(1)
    launches: list[float] = []

    def step() -> float:
        pick = sorted(rng.choice(n, int(rng.integers(lo, hi + 1)), replace=False)) if args.vary else range(n)
        batch = [streams[k] for k in pick]
        for k, s in zip(pick, batch):
            p = pos[k] % (tone.size - chunk)
            s.push_audio(tone[p: p + chunk])
            pos[k] += chunk
        t0 = time.perf_counter()
        launched = rec.launch(batch)
        launches.append(time.perf_counter() - t0)
        launched.collect().chunks()
        return time.perf_counter() - t0

    for _ in range(3):  # captures graphs for this batch size
        step()
    launches.clear()
    plain = [step() for _ in range(args.steps)]
    launch_ms = 1000 * float(np.median(launches))
    prof = cProfile.Profile()
    prof.enable()
    profiled = [step() for _ in range(args.steps)]
    prof.disable()
    st = pstats.Stats(prof)
    total = sum(profiled)

    def cum(patterns: tuple[str, ...]) -> float:
        """Cumulative time per pattern (the largest match: the outermost of nested same-named
        calls, e.g. a bucketed decoder calling its graph decoder), summed over the patterns."""
        stats = st.stats  # type: ignore[attr-defined]
        return sum(max((v[3] for k, v in stats.items() if p in f"{Path(k[0]).name}:{k[2]}"), default=0.0)
                   for p in patterns)

    rows = {name: cum(pats) / args.steps for name, pats in PHASES.items()}
    step_ms = 1000 * float(np.median(plain))
    print(f"{n} streams{f' ({lo}-{hi} a step)' if args.vary else ''}, {args.chunk_ms} ms chunks, {args.device} "
          f"{args.dtype}, graphs {args.graphs}, features on {args.features}, {args.cache} cache: "
          f"step {step_ms:.1f} ms median without the profiler, its launch (host) {launch_ms:.1f} ms "
          f"({1000 * total / args.steps:.1f} ms with the profiler; chunk {args.chunk_ms} ms)")
    for name, sec in rows.items():
        print(f"  {name:45s} {1000 * sec:8.1f} ms  {100 * sec * args.steps / total:5.1f} %")
    st.sort_stats("tottime").print_stats(15)
    syncs = sync_points(step) if model.device.type == "cuda" else []
    if syncs:
        print("host waits for the GPU in one step (torch.cuda sync debug mode):")
        print("\n".join(f"  {line}" for line in syncs))
    synced = gpu_phases(rec, step, args.steps) if model.device.type == "cuda" else {}
    if synced:
        print("each phase on its own, the GPU waited for before and after (median per step):")
        for name, ms in synced.items():
            print(f"  {name:45s} {ms:8.1f} ms")
    if args.kernels and model.device.type == "cuda":
        print(f"operators and kernels by their own GPU time, {args.steps} steps (torch.profiler):")
        print(kernel_table(step, args.steps, args.kernels))
    if args.json:
        args.json.write_text(json.dumps({"streams": n, "chunk_ms": args.chunk_ms, "device": args.device,
                                         "dtype": args.dtype, "graphs": args.graphs, "features": args.features,
                                         "cache": args.cache,
                                         "vary": args.vary, "step_ms": step_ms, "launch_ms": launch_ms,
                                         "profiled_step_ms": 1000 * total / args.steps,
                                         "phases_ms": {k: 1000 * v for k, v in rows.items()},
                                         "synced_phases_ms": synced, "sync_points": syncs,
                                         "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None},
                                        indent=1))


if __name__ == "__main__":
    main()
