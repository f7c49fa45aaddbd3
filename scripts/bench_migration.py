#!/usr/bin/env python3
"""Live-migration benchmark: a real daemon serving N real-time streams of a FastConformer-L sized
model (random weights) while the admin API moves it, e.g. cpu -> cuda:0 -> bf16 -> fp32 -> cpu.

The clients run in `--client-procs` processes of their own. Reports per move: the engine
pause (swap + state conversion, from the admin report; the probe step and the allocation of the
target's buffers happen before it), the serving gap (last step completed before the move -> first step completed after,
as clients see it), the first post-move step and the decoder's graph re-capture inside it,
against the median step, peak GPU memory during the move, and streams dropped. Then a plain `model.to()`
between steps (no admin path) and checks that results keep coming. Prints a table, writes JSON.

    python scripts/bench_migration.py --streams 256 --moves cuda:0/fp32,cuda:0/bf16,cuda:0/fp32,cpu/fp32
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
import torch
import websockets

from streamd.config import AdminConfig, Config, EngineConfig, ServerConfig
from streamd.decoding.greedy import GreedyLabelLooping
from streamd.model.tokenizer import Tokenizer
from streamd.model.checkpoint import save_streamd
from streamd.model.dims import ModelDims
from streamd.model.transducer import Transducer
from streamd.server.app import App, build_state
from streamd.server.metrics import Metrics

FASTCONFORMER_L = dict(d_model=512, n_layers=17, n_heads=8, subsampling_channels=256, pred_hidden=640,
                       joint_hidden=640, ctc_head=True)


def make_model(path: Path, vocab: int, seed: int = 0) -> None:
    """Random FastConformer-L sized hybrid model with a SentencePiece tokenizer; the joint is
    biased toward blank so that the emission rate looks like a trained model's."""
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(2, 9))) for _ in range(4000)]
    lines = (" ".join(rng.choice(words, 12)) for _ in range(20000))
    proto = tempfile.NamedTemporaryFile(suffix=".model", delete=False).name[:-6]
    spm.SentencePieceTrainer.train(sentence_iterator=lines, model_prefix=proto, vocab_size=vocab,
                                   model_type="bpe", minloglevel=2)
    tok = Tokenizer(Path(proto + ".model").read_bytes())
    torch.manual_seed(seed)
    m = Transducer(ModelDims(vocab_size=tok.vocab_size, **FASTCONFORMER_L)).eval()
    calibrate(m, rng)
    save_streamd(path, m, tok, "fastconformer-l-random")


@torch.no_grad()
def calibrate(m: Transducer, rng: np.random.Generator) -> None:
    """Random encoders barely vary over time; make the joint follow the encoder, and give blank
    the bias that lets it win on ~95% of frames, so the decoder emits about one label every two
    frames (greedy re-checks after each label)."""
    m.joint.enc.weight.mul_(30)
    t = np.arange(16000 * 6) / 16000
    x = torch.from_numpy((0.2 * np.sin(2 * np.pi * 200 * t) + rng.normal(0, 0.01, t.size)).astype(np.float32))[None]
    enc, _ = m.encoder(*m.preprocessor(x, torch.tensor([x.shape[1]])), m.dims.att_context())
    logits = m.joint.joint_after_projection(m.joint.project_encoder(enc[0]),
                                            GreedyLabelLooping.for_model(m).initial_state(1).gproj)
    blank = m.dims.blank_id
    margin = logits[:, :blank].max(1).values - logits[:, blank]
    m.joint.joint_net[-1].bias[blank] += torch.quantile(margin, 0.95)


async def client(url: str, seconds: float, rng: np.random.Generator, log: dict[str, Any]) -> None:
    """One real-time stream of tones and noise; records when results arrive."""
    t = np.arange(int(seconds * 16000)) / 16000
    audio = (0.2 * np.sin(2 * np.pi * rng.uniform(120, 300) * t) * (np.sin(2 * np.pi * 0.7 * t) > 0)
             + rng.normal(0, 0.01, t.size))
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    log.update(results=[], lags=[], closed=None, sent=0.0)
    async with websockets.connect(url + "/v1/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"}))

        async def read() -> None:
            async for m in ws:
                d = json.loads(m)
                if d["type"] in ("partial", "final"):
                    log["results"].append(time.monotonic())
                    # audio sent but not yet reflected in this result (includes the chunk itself)
                    log["lags"].append((time.monotonic(), log["sent"] - d["audio_processed"]))
                elif d["type"] == "summary":
                    log["summary"] = d

        reader = asyncio.create_task(read())
        await asyncio.sleep(rng.uniform(0, 1.0))  # staggered phases, as real clients are
        t0, step = time.monotonic(), 3200  # 200 ms frames
        for i in range(0, len(pcm), step):
            await ws.send(pcm[i: i + step])
            log["sent"] = (i + step) / 32000
            await asyncio.sleep(max(0.0, t0 + (i + step) / 32000 - time.monotonic()))
        await ws.send(json.dumps({"type": "stop"}))
        await reader
    log["closed"] = ws.close_code


def client_process(url: str, seconds: float, seeds: list[int]) -> list[dict[str, Any]]:
    """Several clients in one process of their own, so that the daemon's event loop serves
    only the daemon (as in production: clients are elsewhere)."""
    async def all_clients() -> list[dict[str, Any]]:
        logs: list[dict[str, Any]] = [{} for _ in seeds]
        await asyncio.gather(*(client(url, seconds, np.random.default_rng(s), log) for s, log in zip(seeds, logs)))
        return logs
    return asyncio.run(all_clients())


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model_path = Path(tempfile.mkdtemp()) / "model.pt"
    make_model(model_path, args.vocab)
    sock = Path(tempfile.mkdtemp()) / "admin.sock"
    first_dev, first_dtype = args.start.split("/")
    cfg = Config(server=ServerConfig(port=0, max_streams=args.streams + 8, idle_timeout_s=60),
                 engine=EngineConfig(model=model_path, device=first_dev, dtype=first_dtype),
                 admin=AdminConfig(socket=sock))
    state = build_state(cfg, Metrics(process=False))
    steps: list[tuple[float, float]] = []  # (completion time, seconds)
    prev = state.engine._on_step

    def on_step(seconds: float, batch: int) -> None:
        steps.append((time.monotonic(), seconds))
        if prev:
            prev(seconds, batch)

    state.engine._on_step = on_step
    app = App(state)
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(app.serve(started))
    port = await started
    url = f"ws://127.0.0.1:{port}"
    loop = asyncio.get_running_loop()
    procs = max(1, min(args.client_procs, args.streams))
    pool = ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn"))
    clients = [loop.run_in_executor(pool, client_process, url, args.seconds, list(range(p, args.streams, procs)))
               for p in range(procs)]
    t_wait = time.monotonic()
    while len(state.live) < args.streams:  # the client processes start (and import) first
        if time.monotonic() - t_wait > 120:
            raise SystemExit(f"only {len(state.live)} of {args.streams} streams connected in 120 s")
        await asyncio.sleep(0.1)
    await asyncio.sleep(args.settle)
    moves = []
    for move in args.moves.split(","):
        device, dtype = move.split("/")
        if torch.cuda.is_available():
            for d in range(torch.cuda.device_count()):
                with torch.cuda.device(d):
                    torch.cuda.reset_peak_memory_stats()
        t_call = time.monotonic()
        report = await app.control.migrate(device, dtype)
        t_done = time.monotonic()
        await asyncio.sleep(args.settle)
        decoder = state.engine.recognizer.search  # the target's, re-captured on its first chunk
        recapture_ms = round(getattr(decoder, "last_capture_ms", 0.0), 1) if getattr(decoder, "rebuilds", 0) else None
        last_before = max((t for t, _ in steps if t <= t_done), default=t_call)
        after = [(t, s) for t, s in steps if t > t_done]
        first_after = after[0] if after else (float("nan"), float("nan"))
        median = statistics.median(s for _, s in steps[-200:]) if steps else float("nan")
        moves.append({
            "move": move, "ok": report.ok, "error": report.error, "prepare_ms": round(report.prepare_ms, 1),
            "pause_ms": round(report.pause_ms, 1),
            "serving_gap_ms": round((first_after[0] - last_before) * 1000, 1),
            "first_step_after_ms": round(first_after[1] * 1000, 1), "median_step_ms": round(median * 1000, 1),
            "recapture_ms": recapture_ms,  # part of the first step after; None: eager decoder (CPU)
            "peak_gpu_mem_gb": {f"cuda:{d}": round(torch.cuda.max_memory_allocated(d) / 2**30, 2)
                                for d in range(torch.cuda.device_count())} if torch.cuda.is_available() else {},
            "streams_live": report.streams,
        })
        print(moves[-1], flush=True)
    # the seed scenario: a plain .to() between steps, no admin path
    plain = {}
    if torch.cuda.is_available():
        n0 = len(steps)
        await state.engine.call(lambda rec: rec.model.to(torch.bfloat16))
        await asyncio.sleep(args.settle)
        plain = {"plain_to_bf16_steps_after": len(steps) - n0, "dtype_now": state.dtype}
        print(plain, flush=True)
    logs = [log for chunk in await asyncio.gather(*clients) for log in chunk]
    pool.shutdown()
    state.shutdown.set()
    await server
    dropped = sum(1 for g in logs if g.get("closed") != 1000 or "summary" not in g)
    lags = sorted(lag for g in logs for _, lag in g["lags"])
    lag_pct = {f"p{q}": round(lags[min(len(lags) - 1, int(q / 100 * len(lags)))], 3) for q in (50, 90, 95, 99)} if lags else {}
    return {"machine": machine(), "streams": args.streams, "seconds": args.seconds, "moves": moves,
            "plain_to": plain, "streams_dropped": dropped, "result_lag_s_all_phases": lag_pct,
            "results_per_stream_min": min(len(g["results"]) for g in logs)}


def machine() -> dict[str, Any]:
    return {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpus": [torch.cuda.get_device_name(d) for d in range(torch.cuda.device_count())]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=40.0, help="audio per stream")
    ap.add_argument("--start", default="cpu/fp32", help="DEVICE/DTYPE the daemon starts on")
    ap.add_argument("--moves", default="cuda:0/fp32,cuda:0/bf16,cuda:0/fp32,cpu/fp32,cuda:0/fp32")
    ap.add_argument("--settle", type=float, default=4.0, help="seconds between moves")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--client-procs", type=int, default=8, help="processes the client streams run in")
    ap.add_argument("--out", default="bench_migration.json")
    args = ap.parse_args()
    result = asyncio.run(run(args))
    print(f"{'move':<16}{'ok':<4}{'pause ms':>10}{'gap ms':>10}{'1st step':>10}{'capture':>9}{'median':>9}  peak GPU GB")
    for m in result["moves"]:
        print(f"{m['move']:<16}{'y' if m['ok'] else 'n':<4}{m['pause_ms']:>10}{m['serving_gap_ms']:>10}"
              f"{m['first_step_after_ms']:>10}{str(m['recapture_ms']):>9}{m['median_step_ms']:>9}  {m['peak_gpu_mem_gb']}")
    print(f"streams dropped: {result['streams_dropped']} of {result['streams']}; result lag (s) {result['result_lag_s_all_phases']}; "
          f"machine {result['machine']}")
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
