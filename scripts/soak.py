#!/usr/bin/env python3
"""Soak test: N streams cycling for a given time, the daemon's resources sampled every 30 s.

Each of `--streams` clients loops: connect, stream 5-15 s of audio in real time (100 ms messages
on an absolute schedule: a test WAV repeated whole, so that every transcript of the same length
must be the same), `stop`, wait for the summary, reconnect. Every `--interval` seconds (30) the
script records the daemon's RSS, open file descriptors and threads (from /proc), GPU memory (from
nvidia-smi, when there is one), and over the interval: sessions finished, errors, transcripts that
differed from the first one of the same audio, and the latency of partials and finals (the wall
time from sending the audio a result covers to receiving it, as scripts/load.py measures it).

Starts a daemon (`python -m streamd serve`; the shipped model unless `--model`) on a free port or
uses `--url` (then `--pid` names the daemon's process for its RSS and fds). Writes JSON (`--json`):
the settings, every sample, and for RSS, fds, threads, GPU memory and p95 latencies the first,
last and largest value while all streams were cycling, after `--warmup` (60 s; other samples have
`in_trend` false). Exit status 1 on any error, changed
transcript or ERROR line in the daemon's log.

    nice python scripts/soak.py --streams 128 --minutes 30 --json benchmarks/soak.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import websockets

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "nemo-tiny"
SERVING = re.compile(r"serving .* on (wss?)://([^:/\s]+):(\d+)/v1/stream")
PIECE_S = 0.1


@dataclass
class Window:
    """What happened between two samples."""

    sessions: int = 0
    errors: list[str] = field(default_factory=list)
    mismatches: int = 0
    partial: list[float] = field(default_factory=list)
    final: list[float] = field(default_factory=list)


@dataclass
class Soak:
    audio: list[np.ndarray]  # 16 kHz int16 clips
    url: str
    deadline: float
    window: Window = field(default_factory=Window)
    first: dict[tuple[int, int], list[str]] = field(default_factory=dict)  # (clip, repeats) -> finals


def start_daemon(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    cmd = [sys.executable, "-m", "streamd", "serve", "--port", "0", "--device", args.device,
           "--max-streams", str(max(64, 2 * args.streams)), "--admin-socket", "", "--config", ""]
    if args.model:
        cmd += ["--model", str(args.model)]
    cmd += shlex.split(args.daemon_args)
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if m := SERVING.search(log.read_text(errors="replace")):
            return proc, f"ws://{m.group(2)}:{m.group(3)}"
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the daemon did not start:\n{log.read_text(errors='replace')[-3000:]}")


def proc_stats(pid: int) -> dict[str, Any]:
    """RSS (MB), open fds and threads of process `pid`; GPU memory (MB) it holds, if any."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {"alive": False}
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return {"alive": True, "rss_mb": round(rss, 1), "fds": fds, "threads": threads, "gpu_mb": gpu_mb(pid)}


def gpu_mb(pid: int) -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = [float(m) for p, m in (line.split(",") for line in out.splitlines() if "," in line) if int(p) == pid]
    return sum(used) if used else None


def percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


async def session(s: Soak, rng: np.random.Generator) -> None:
    """One connection: a clip repeated to 5-15 s, sent in real time; results timed and checked."""
    clip_i = int(rng.integers(len(s.audio)))
    clip = s.audio[clip_i]
    repeats = max(1, round(float(rng.uniform(5, 15)) * 16000 / clip.size))
    pcm = np.tile(clip, repeats).tobytes()
    step = int(16000 * PIECE_S) * 2
    sent_at: list[float] = []  # wall time each 100 ms piece was sent
    finals: list[str] = []
    async with websockets.connect(s.url + "/v1/stream", max_size=None, open_timeout=30) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"}))
        if (ready := json.loads(await ws.recv()))["type"] != "ready":
            s.window.errors.append(str(ready)[:200])
            return

        async def send() -> None:
            t0 = time.monotonic()
            for k, i in enumerate(range(0, len(pcm), step)):
                await asyncio.sleep(max(0.0, t0 + k * PIECE_S - time.monotonic()))
                await ws.send(pcm[i: i + step])
                sent_at.append(time.monotonic())
            await ws.send(json.dumps({"type": "stop"}))

        sender = asyncio.create_task(send())
        async for text in ws:
            m = json.loads(text)
            if m["type"] in ("partial", "final") and sent_at:
                k = min(len(sent_at) - 1, max(0, int(np.ceil(m["audio_processed"] / PIECE_S)) - 1))
                (s.window.partial if m["type"] == "partial" else s.window.final).append(time.monotonic() - sent_at[k])
                if m["type"] == "final":
                    finals.append(m["text"])
            elif m["type"] == "error":
                s.window.errors.append(f"{m['code']}: {m['message'][:200]}")
        await sender
    if ws.close_code != 1000:
        s.window.errors.append(f"closed {ws.close_code}")
        return
    s.window.sessions += 1
    key = (clip_i, repeats)
    if s.first.setdefault(key, finals) != finals:
        s.window.mismatches += 1


async def client(s: Soak, index: int, seed: int) -> None:
    rng = np.random.default_rng([seed, index])
    await asyncio.sleep(float(rng.uniform(0, 5)))  # spread the starts
    while time.monotonic() < s.deadline:
        try:
            await session(s, rng)
        except (OSError, websockets.WebSocketException) as e:
            s.window.errors.append(f"{type(e).__name__}: {str(e)[:200]}")
            await asyncio.sleep(1)


async def soak(args: argparse.Namespace, url: str, pid: int | None) -> list[dict[str, Any]]:
    audio = [sf.read(str(p), dtype="int16")[0] for p in args.wav]
    s = Soak(audio, url, time.monotonic() + args.minutes * 60)
    clients = [asyncio.create_task(client(s, i, args.seed)) for i in range(args.streams)]
    samples, t0 = [], time.monotonic()
    while not all(c.done() for c in clients):
        await asyncio.wait(clients, timeout=args.interval)
        w, s.window = s.window, Window()
        # Not in the trend: the warm-up (allocator pools still filling), and the end, when the
        # last sessions finish and fewer streams are open.
        sample = {"t_s": round(time.monotonic() - t0),
                  "in_trend": args.warmup <= time.monotonic() - t0 and time.monotonic() <= s.deadline,
                  **(proc_stats(pid) if pid else {}),
                  "sessions": w.sessions, "errors": len(w.errors), "error_examples": w.errors[:3],
                  "transcript_mismatches": w.mismatches,
                  "partial_latency_p50_s": percentile(w.partial, 50), "partial_latency_p95_s": percentile(w.partial, 95),
                  "final_latency_p95_s": percentile(w.final, 95)}
        samples.append(sample)
        print(json.dumps(sample), flush=True)
    for c in clients:
        c.result()
    return samples


def trend(samples: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """First, last and largest value of `key` while every stream was cycling, and the change."""
    values = [x[key] for x in samples if x.get(key) is not None and x["in_trend"]]
    if len(values) < 2:
        return {}
    first, last = values[0], values[-1]
    return {"first": first, "last": last, "max": max(values), "change_pct": round(100 * (last - first) / first, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=16, help="streams at once (default: %(default)s)")
    ap.add_argument("--minutes", type=float, default=30.0, help="how long (default: %(default)s)")
    ap.add_argument("--interval", type=float, default=30.0, help="seconds between samples (default: %(default)s)")
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds left out of the trend (default: %(default)s)")
    ap.add_argument("--url", help="soak this daemon (ws://HOST:PORT) instead of starting one")
    ap.add_argument("--pid", type=int, help="with --url: the daemon's process id, for RSS and fds")
    ap.add_argument("--model", type=Path, help="model of the started daemon (default: the shipped one)")
    ap.add_argument("--device", default="cpu", help="device of the started daemon (default: %(default)s)")
    ap.add_argument("--daemon-args", default="", help="more `streamd serve` flags, e.g. '--admission max_streams'")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write settings, samples and trends here")
    ap.add_argument("wav", nargs="*", type=Path, default=sorted(FIXTURES.glob("in*.wav")),
                    help="16 kHz WAV clips to stream (default: the test inputs)")
    args = ap.parse_args()
    proc, pid, url = None, args.pid, args.url
    log = Path(tempfile.mkdtemp(prefix="streamd-soak-")) / "daemon.log"
    if url is None:
        proc, url = start_daemon(args, log)
        pid = proc.pid
    try:
        samples = asyncio.run(soak(args, url, pid))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(120)
    errors_logged = [line[:300] for line in log.read_text(errors="replace").splitlines()
                     if " ERROR " in line or line.startswith("Traceback")][:20] if proc is not None else None
    result = {"streams": args.streams, "minutes": args.minutes, "interval_s": args.interval,
              "warmup_s": args.warmup, "url": url,
              "model": str(args.model or "the shipped model"), "device": args.device,
              "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
              "samples": samples, "sessions": sum(x["sessions"] for x in samples),
              "errors": sum(x["errors"] for x in samples),
              "transcript_mismatches": sum(x["transcript_mismatches"] for x in samples),
              "daemon_errors_logged": errors_logged,
              "trend": {k: trend(samples, k) for k in ("rss_mb", "fds", "threads", "gpu_mb",
                                                         "partial_latency_p95_s", "final_latency_p95_s")}}
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if not result["errors"] and not result["transcript_mismatches"] and not errors_logged else 1


if __name__ == "__main__":
    sys.exit(main())
