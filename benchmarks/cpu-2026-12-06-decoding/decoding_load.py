#!/usr/bin/env python3
"""How hard a model makes the greedy decoder work on a stream step: `--streams` fresh streams
stepped together through `Recognizer` on the CPU (fp32) at `--right-context`, counting the
label-looping decoder's outer iterations per step (the stream with the most labels at a frame sets
them) and the labels per stream-step. Audio: the benchmarks' tone bursts (seeds 100 on, not the
calibration's), or real speech files with `--audio`.

    python benchmarks/cpu-2026-12-06-decoding/decoding_load.py --model MODEL.pt --right-context 1 --steps 50
    python benchmarks/cpu-2026-12-06-decoding/decoding_load.py --model streamd/assets/default-model.pt \
        --right-context 1 --steps 37 --audio /work/shared/data/real-speech/*/*.ogg
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]
import load  # noqa: E402
from streamd.decoding.greedy import GreedyLabelLooping  # noqa: E402
from streamd.engine.recognizer import Recognizer  # noqa: E402
from streamd.model.checkpoint import load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--right-context", type=int, required=True)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--audio", nargs="*", default=[])
    args = ap.parse_args()
    torch.set_num_threads(2)
    m = load_model(Path(args.model)).model.eval()
    rec = Recognizer(m, args.streams, m.dims.att_context_with_right(args.right_context))
    g = rec.geometry
    seconds = args.steps * g.chunk_ms / 1000 + 1
    if args.audio:
        audio = []
        for f in sorted(args.audio)[: args.streams]:
            x, sr = sf.read(f, dtype="float32")
            x = soxr.resample(x, sr, 16000) if sr != 16000 else x
            audio.append(np.pad(x, (0, max(0, int(seconds * 16000) - x.size))))
    else:
        audio = [np.frombuffer(load.tone_bursts(seconds=seconds, seed=100 + s).pcm, "<i2").astype(np.float32) / 32768
                 for s in range(args.streams)]
    outer = [0]
    original = GreedyLabelLooping.before_inner_loop

    def counted(self: GreedyLabelLooping, loop: object) -> None:
        outer[0] += 1
        original(self, loop)  # type: ignore[arg-type]
    GreedyLabelLooping.before_inner_loop = counted  # type: ignore[method-assign]
    streams = [rec.open() for _ in audio]
    at, per_step, labels, most = [0] * len(audio), [], 0, 0
    for k in range(args.steps):
        need = g.samples_for(g.frames_after(k + 1)) - g.samples_for(g.frames_after(k))
        for i, s in enumerate(streams):
            s.push_audio(audio[i][at[i]: at[i] + need])
            at[i] += need
        outer[0] = 0
        for r in rec.step(streams):
            labels += len(r.tokens)
            if r.times:
                most = max(most, int(np.bincount(np.asarray(r.times) - min(r.times)).max()))
        per_step.append(outer[0])
    print(f"{args.model} at {g.chunk_ms} ms (right context {args.right_context}), {len(streams)} streams, "
          f"{args.steps} steps: decoder outer iterations a step median {np.median(per_step):g}, max {max(per_step)}; "
          f"labels a stream-step {labels / (len(streams) * args.steps):.2f}; most labels at one frame {most}")


if __name__ == "__main__":
    main()
