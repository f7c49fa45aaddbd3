#!/usr/bin/env python3
"""Benchmark the label-looping greedy decoder: reference eager vs CUDA graphs (no_while_loops)
vs full graph (conditional WHILE nodes), all measured in one run on the same inputs.

The model is the decoder side of NeMo's 114M FastConformer-L RNN-T (encoder output 512,
pred_hidden 640, joint_hidden 640, vocab 1024 + blank, one LSTM layer) with random weights; the
joint's output layer is spread and its blank bias calibrated so that greedy search on N(0,1)
encoder output emits about one label per 3 frames, as trained models do on speech.

Per (batch, chunk frames) it reports decoder time per chunk, synchronised after every call as
the engine does (it reads the labels every step), the decoder state carried across chunks; then
the re-capture cost after model moves (fp32 -> bf16 -> fp32, weights replaced).

    python scripts/bench_decoder.py --out bench.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from streamd.decoding.cuda_conditional import unsupported_reason
from streamd.decoding.graphs import FULL_GRAPH, NO_WHILE_LOOPS, GraphGreedyLabelLooping
from streamd.decoding.greedy import GreedyLabelLooping
from streamd.model.dims import ModelDims
from streamd.model.rnnt import Joint, Predictor

MODES = ("eager", NO_WHILE_LOOPS, FULL_GRAPH)


class DecoderSide(torch.nn.Module):
    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.dims = dims
        self.decoder, self.joint = Predictor(dims), Joint(dims)


def build(seed: int, device: torch.device, target_rate: float) -> tuple[DecoderSide, float, float]:
    torch.manual_seed(seed)
    dims = ModelDims(vocab_size=1024, d_model=512, pred_hidden=640, joint_hidden=640, pred_rnn_layers=1)
    m = DecoderSide(dims).to(device).eval()
    out = m.joint.joint_net[-1]
    with torch.no_grad():
        out.weight.mul_(8.0)  # spread the logits as a trained joint's are
    base = out.bias[dims.blank_id].item()
    gen = torch.Generator(device=device).manual_seed(seed)
    enc = [torch.randn(64, 14, dims.d_model, device=device, generator=gen) for _ in range(6)]
    lengths = torch.full((64,), 14, device=device)

    def rate(bias: float) -> float:
        with torch.no_grad():
            out.bias[dims.blank_id] = base + bias
        ref, state, n = GreedyLabelLooping(m.decoder, m.joint, dims.blank_id), None, 0
        for e in enc:
            hyps, state = ref(e, lengths, state)
            n += int(hyps.lengths.sum())
        return n / (64 * 14 * len(enc))

    lo, hi = 0.0, 40.0  # rate falls as the blank bias grows
    for _ in range(14):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) > target_rate else (lo, mid)
    bias = (lo + hi) / 2
    return m, bias, rate(bias)


def make(m: DecoderSide, mode: str, batch: int, frames: int) -> Any:
    if mode == "eager":
        return GreedyLabelLooping(m.decoder, m.joint, m.dims.blank_id)
    return GraphGreedyLabelLooping(m.decoder, m.joint, m.dims.blank_id, max_batch=batch, max_frames=frames,
                                   mode=mode)


def run_chunks(dec: Any, chunks: list[torch.Tensor], lengths: torch.Tensor, device: torch.device
               ) -> tuple[float, list[list[int]], int]:
    """ms per chunk (synchronised per call), each row's labels, labels emitted."""
    state, labels, n = None, [[] for _ in range(chunks[0].shape[0])], 0
    torch.cuda.synchronize(device)
    total = 0.0
    for e in chunks:
        t0 = time.perf_counter()
        hyps, state = dec(e, lengths, state)
        torch.cuda.synchronize(device)
        total += time.perf_counter() - t0
        for row, (toks, _) in zip(labels, hyps.to_lists()):
            row.extend(toks)
        n += int(hyps.lengths.sum())
    return total / len(chunks) * 1e3, labels, n


def bench(m: DecoderSide, batches: list[int], frames: list[int], n_chunks: int, device: torch.device,
          dtype: torch.dtype) -> list[dict[str, Any]]:
    rows, max_t = [], max(frames)
    gen = torch.Generator(device=device).manual_seed(1)
    for b in batches:
        decoders = {mode: make(m, mode, b, max_t) for mode in MODES}
        for t in frames:
            chunks = [torch.randn(b, t, m.dims.d_model, device=device, generator=gen).to(dtype)
                      for _ in range(n_chunks)]
            lengths = torch.full((b,), t, device=device)
            row: dict[str, Any] = {"batch": b, "frames": t}
            outputs = {}
            for mode, dec in decoders.items():
                run_chunks(dec, chunks[:3], lengths, device)  # warm-up (and capture)
                ms, labels, n = run_chunks(dec, chunks, lengths, device)
                row[f"{mode}_ms"] = round(ms, 4)
                outputs[mode] = labels
                row["labels_per_frame"] = round(n / (b * t * n_chunks), 3)
                if mode != "eager":
                    row[f"{mode}_ran_as"] = dec.mode
            for mode in MODES[1:]:
                row[f"{mode}_speedup"] = round(row["eager_ms"] / row[f"{mode}_ms"], 2)
                row[f"{mode}_same_labels"] = outputs[mode] == outputs["eager"]
            rows.append(row)
            same = row[NO_WHILE_LOOPS + "_same_labels"] and row[FULL_GRAPH + "_same_labels"]
            print(f"{b:6d} {t:4d} {row['labels_per_frame']:6.2f} {row['eager_ms']:10.3f}"
                  f" {row[NO_WHILE_LOOPS + '_ms']:10.3f} {row[FULL_GRAPH + '_ms']:10.3f}"
                  f" {row[NO_WHILE_LOOPS + '_speedup']:8.2f}x {row[FULL_GRAPH + '_speedup']:8.2f}x"
                  f"  {row[FULL_GRAPH + '_ran_as']}{'' if same else '  LABELS DIFFER'}", flush=True)
        del decoders
        torch.cuda.empty_cache()
    return rows


def recapture(m: DecoderSide, batch: int, t: int, device: torch.device) -> list[dict[str, Any]]:
    """Cost of the first call after a change that forces a rebuild, beyond a steady call."""
    out = []
    enc = torch.randn(batch, t, m.dims.d_model, device=device)
    lengths = torch.full((batch,), t, device=device)

    def call(d: GraphGreedyLabelLooping) -> float:
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        d(enc, lengths)
        torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) * 1e3

    def swap_weights() -> None:
        m.load_state_dict({k: v.clone() for k, v in m.state_dict().items()}, assign=True)

    changes = [("fp32->bf16", lambda: m.to(torch.bfloat16)), ("bf16->fp32", lambda: m.to(torch.float32)),
               ("weights replaced", swap_weights)]
    for mode in (NO_WHILE_LOOPS, FULL_GRAPH):
        d = make(m, mode, batch, 20)
        first = call(d)
        steady = min(call(d) for _ in range(5))
        out.append({"mode": mode, "change": "first call", "call_ms": round(first, 2), "steady_ms": round(steady, 3),
                    "capture_ms": round(d.last_capture_ms, 2)})
        for change, act in changes:
            act()
            first = call(d)
            steady = min(call(d) for _ in range(5))
            out.append({"mode": mode, "change": change, "call_ms": round(first, 2), "steady_ms": round(steady, 3),
                        "recapture_ms": round(first - steady, 2), "capture_ms": round(d.last_capture_ms, 2),
                        "ran_as": d.mode, "reason": d.last_rebuild_reason})
            print(f"  {mode:15s} {change:17s} first call {first:8.1f} ms, steady {steady:7.3f} ms, "
                  f"capture {d.last_capture_ms:7.1f} ms ({d.mode})", flush=True)
        d.reset()
    return out


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "full_graph_unsupported_reason": unsupported_reason(device)}
    try:
        from cuda import bindings
        from cuda.bindings import driver
        env["cuda_bindings"] = bindings.__version__
        env["driver_cuda_version"] = driver.cuDriverGetVersion()[1]
    except Exception as e:  # noqa: BLE001 - report whatever is there
        env["cuda_bindings"] = f"unavailable: {e}"
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,16,64,256,1024")
    ap.add_argument("--frames", default="1,2,7,14", help="encoder frames per chunk")
    ap.add_argument("--chunks", type=int, default=20, help="timed chunks per configuration")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--rate", type=float, default=1 / 3, help="target labels per encoder frame")
    ap.add_argument("--recapture-batch", type=int, default=256)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="bench_decoder.json")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]

    env = environment(device)
    print(json.dumps(env))
    m, bias, rate = build(0, device, args.rate)
    m.to(dtype)
    print(f"blank bias +{bias:.2f}: {rate:.3f} labels per frame (fp32 calibration)")
    print(f"{'batch':>6} {'T':>4} {'lab/fr':>6} {'eager ms':>10} {'graphs ms':>10} {'full ms':>10} "
          f"{'graphs':>9} {'full':>9}  full ran as")
    rows = bench(m, [int(x) for x in args.batches.split(",")], [int(x) for x in args.frames.split(",")],
                 args.chunks, device, dtype)
    print(f"re-capture after a change (batch {args.recapture_batch}, 14 frames):")
    rec = recapture(m.float(), args.recapture_batch, 14, device)
    result = {"environment": env, "dtype": args.dtype, "chunks": args.chunks,
              "model": {**m.dims.to_dict(), "blank_bias": bias, "calibrated_labels_per_frame": rate},
              "results": rows, "recapture": rec}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    at256 = [r for r in rows if r["batch"] == 256]
    if at256:
        print(f"batch 256 speed-up over eager: graphs {[r[NO_WHILE_LOOPS + '_speedup'] for r in at256]}, "
              f"full graph {[r[FULL_GRAPH + '_speedup'] for r in at256]}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
