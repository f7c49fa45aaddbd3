#!/usr/bin/env python3
"""Load test: how many real-time streams a streamd daemon serves, and with what latency.

Starts a daemon (`python -m streamd serve --model M --device D`, on a free port) or connects to
one (`--url`), then runs levels of N concurrent streams. Every stream sends audio in real time
(`--send-ms` per message, on an absolute schedule), looping its WAV file (or synthesised tone
bursts when none is given), for `--seconds`, then `stop`, and records:

* result latency: for each `partial` / `final`, the wall time between sending the audio that ends
  at its `audio_processed` and receiving it (the pipeline's delay, network included);
* lag: audio sent so far minus the server-reported `audio_processed`, when a result arrives
  (grows without bound when the daemon falls behind; up to about one chunk is normal);
* drain: time from `stop` to `summary` (the server's backlog for this stream);
* send lateness: how late the client itself sent audio (a busy client invalidates a level).

A stream keeps up when it got no error and its drain and p95 lag are at most `--max-latency-s`
(default: chunk + 1 s). A level passes when every stream kept up and the p95 partial and final
latencies are at most `--max-latency-s`. Levels double from `--start` until one fails (or
`--max-streams`), then `--refine` bisection steps narrow the limit. Each level lasts about
`--seconds` + `--ramp-s` + the drain, so the whole run is bounded.

Prints a table and writes JSON (`--json`) with the machine (CPU model, cores, GPU, torch), the
daemon (model, device, dtype, chunk) and every level.

Examples:
    python scripts/load.py --model model.nemo --device cpu --seconds 10
    python scripts/load.py --model model.nemo --device cuda --dtype bf16 --start 16 \\
        --max-streams 1024 --client-procs 8 --json h200.json speech1.wav speech2.wav
    python scripts/load.py --url ws://10.0.0.5:8765 speech.wav
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import websockets

REPO = Path(__file__).resolve().parents[1]
SERVING = re.compile(r"serving .* on (wss?)://([^:/\s]+):(\d+)/v1/stream")
# Server metrics whose change over a level is reported: (sum, count) pairs of histograms.
HISTOGRAMS = ("streamd_batch_size", "streamd_decode_step_seconds")


# -- audio -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Audio:
    """Mono s16le PCM to loop, at its own rate (the daemon resamples other rates)."""

    name: str
    rate: int
    pcm: bytes

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 2 / self.rate


def load_wav(path: Path) -> Audio:
    """A WAV/FLAC file mixed to mono s16le."""
    import soundfile as sf  # only needed for WAV input

    data, rate = sf.read(str(path), dtype="int16", always_2d=True)
    mono = data.mean(axis=1).round().astype("<i2")
    return Audio(path.name, int(rate), mono.tobytes())


def tone_bursts(seconds: float = 6.0, rate: int = 16000, seed: int = 0) -> Audio:
    """Amplitude-modulated tone bursts with pauses: something to decode (and endpoint) without a
    speech file. A real model may emit nothing for it; pass speech WAVs for meaningful latencies."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    out = 0.003 * rng.standard_normal(t.size)
    start = 0.2
    while start < seconds - 0.8:
        length = rng.uniform(0.4, 1.2)
        sel = (t >= start) & (t < min(start + length, seconds))
        f0, fm = rng.uniform(150, 600), rng.uniform(3, 8)
        burst = np.sin(2 * np.pi * f0 * t[sel]) + 0.5 * np.sin(2 * np.pi * 2.7 * f0 * t[sel])
        out[sel] += 0.25 * burst * (0.6 + 0.4 * np.sin(2 * np.pi * fm * t[sel]))
        start += length + rng.uniform(0.3, 1.2)
    return Audio("tone-bursts", rate, np.clip(out * 32767, -32768, 32767).astype("<i2").tobytes())


# -- one stream --------------------------------------------------------------------------------

@dataclass
class StreamStats:
    """What one stream measured (seconds)."""

    index: int
    partial_latency: list[float] = field(default_factory=list)
    final_latency: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)
    drain: float | None = None
    send_late_max: float = 0.0
    audio_sent: float = 0.0
    error: str | None = None
    ready: dict[str, Any] | None = None


def looped(audio: Audio, seconds: float) -> bytes:
    """`audio` repeated to last at least `seconds`."""
    return audio.pcm * (1 + math.ceil(seconds / max(audio.seconds, 1e-3)))


async def run_stream(url: str, index: int, audio: Audio, pcm: bytes, seconds: float, send_s: float,
                     start_at: float) -> StreamStats:
    """One real-time stream of `pcm` (`audio` looped) from `start_at` (time.time()) for `seconds`,
    then `stop`."""
    st = StreamStats(index)
    step = int(audio.rate * send_s) * 2  # bytes per message
    n_msgs = max(1, round(seconds / send_s))
    sent_at: list[float] = []  # wall time at which audio [0, (k+1) * send_s) had been sent
    await asyncio.sleep(max(0.0, start_at - time.time()))
    try:
        async with websockets.connect(url + "/v1/stream", max_size=None, open_timeout=30) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": audio.rate, "encoding": "s16le"}))
            st.ready = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if st.ready.get("type") != "ready":
                st.error = f"{st.ready.get('code')}: {st.ready.get('message')}"
                return st
            stop_sent: list[float] = []
            reader = asyncio.create_task(_read(ws, st, sent_at, send_s, stop_sent))
            t0 = time.perf_counter()
            for k in range(n_msgs):
                due = t0 + k * send_s
                now = time.perf_counter()
                if due > now:
                    await asyncio.sleep(due - now)
                st.send_late_max = max(st.send_late_max, time.perf_counter() - due)
                await ws.send(pcm[k * step: (k + 1) * step])
                sent_at.append(time.perf_counter())
                st.audio_sent = (k + 1) * send_s
                if reader.done():
                    break
            stop_sent.append(time.perf_counter())
            await ws.send(json.dumps({"type": "stop"}))
            await asyncio.wait_for(reader, 60)
    except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as e:
        st.error = st.error or f"{type(e).__name__}: {e}"
    return st


async def _read(ws: Any, st: StreamStats, sent_at: list[float], send_s: float, stop_sent: list[float]) -> None:
    async for text in ws:
        now = time.perf_counter()
        msg = json.loads(text)
        kind = msg["type"]
        if kind in ("partial", "final"):
            processed = float(msg["audio_processed"])
            k = min(max(0, math.ceil(processed / send_s - 1e-6) - 1), len(sent_at) - 1)
            if k >= 0:
                (st.partial_latency if kind == "partial" else st.final_latency).append(now - sent_at[k])
            st.lag.append(max(0.0, len(sent_at) * send_s - processed))
        elif kind == "summary":
            if stop_sent:
                st.drain = now - stop_sent[0]
        elif kind == "error":
            st.error = f"{msg['code']}: {msg['message']}"


async def run_streams(url: str, indices: list[int], audios: list[Audio], seconds: float, send_s: float,
                      start_at: float, ramp_s: float) -> list[StreamStats]:
    """Streams `indices`, started evenly over `ramp_s` from `start_at`, each looping one file."""
    n = max(1, max(indices) + 1)
    pcms = [looped(a, seconds) for a in audios]
    jobs = [run_stream(url, i, audios[i % len(audios)], pcms[i % len(audios)], seconds, send_s,
                       start_at + ramp_s * i / n) for i in indices]
    return list(await asyncio.gather(*jobs))


def _worker(url: str, indices: list[int], audios: list[Audio], seconds: float, send_s: float,
            start_at: float, ramp_s: float) -> list[dict[str, Any]]:
    """Process-pool entry point: one client process's share of a level."""
    stats = asyncio.run(run_streams(url, indices, audios, seconds, send_s, start_at, ramp_s))
    return [asdict(s) for s in stats]


# -- the daemon --------------------------------------------------------------------------------

class Daemon:
    """`python -m streamd serve` on a free port; stderr kept (last lines) for error reports."""

    def __init__(self, model: str, device: str, dtype: str, max_streams: int, extra: list[str],
                 log_path: Path | None = None) -> None:
        cmd = [sys.executable, "-m", "streamd", "serve", "--config", "", "--model", model, "--device", device,
               "--dtype", dtype, "--port", "0", "--admin-socket", "", "--max-streams", str(max_streams),
               "--idle-timeout-s", "120", "--drain-timeout-s", "10", *extra]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace")
        # the CPU the daemon keeps for its engine thread (`--thread-cpu`): see `keep_off`
        self.thread_cpu = int(extra[extra.index("--thread-cpu") + 1]) if "--thread-cpu" in extra else None
        self.log: deque[str] = deque(maxlen=40)
        self.log_file = open(log_path, "w") if log_path is not None else None  # every line
        self.url = ""
        self._bound = threading.Event()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())
            if self.log_file is not None:
                self.log_file.write(line)
                self.log_file.flush()
            if not self._bound.is_set() and (m := SERVING.search(line)):
                self.url = f"{m[1]}://{m[2]}:{m[3]}"
                self._bound.set()
        if self.log_file is not None:  # the daemon's stderr ended
            self.log_file.close()
        self._bound.set()

    def wait_serving(self, timeout: float = 600) -> str:
        if not self._bound.wait(timeout) or not self.url:
            self.stop()
            raise RuntimeError("the daemon did not start:\n" + "\n".join(self.log))
        return self.url

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def scrape(url: str) -> dict[str, float]:
    """The daemon's unlabelled metric samples from /metrics."""
    http = url.replace("ws", "http", 1) + "/metrics"
    try:
        with urllib.request.urlopen(http, timeout=10) as r:
            text = r.read().decode()
    except OSError as e:  # URLError, HTTPError, a timeout: the daemon is down or not streamd
        raise SystemExit(f"load.py: no streamd daemon answered {http}: {getattr(e, 'reason', e)}") from None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def py_spy_exe() -> str:
    """py-spy's path: on PATH, or on the GPU machine in /tmp/site/bin, from the carried wheels."""
    return shutil.which("py-spy") or "/tmp/site/bin/py-spy"


def py_spy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    """Sample daemon process `pid` and its children (engine and front ends, every thread) for
    `seconds` with py-spy, as raw collapsed stacks in `out` (its errors beside it, `.err`); None
    when `seconds` is 0 or py-spy is not installed (`py_spy_exe`)."""
    exe = py_spy_exe()
    if seconds <= 0 or not Path(exe).exists():
        return None
    with open(out.with_suffix(".err"), "w") as err:  # the child keeps its own copy
        return subprocess.Popen([exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "50",
                                 "--format", "raw", "--threads", "--subprocesses", "--nonblocking", "-o", str(out)],
                                stdout=subprocess.DEVNULL, stderr=err)


class StackDumps:
    """Every `every_s` seconds, py-spy's stack of every thread of daemon process `pid` and its
    children (engine and front ends), appended to `out` with the time: where each thread was when
    a run stalls (`now()` adds one at once). Inert when `every_s` is 0 or py-spy is missing."""

    def __init__(self, pid: int, every_s: float, out: Path) -> None:
        self.pid, self.every_s, self.out = pid, every_s, out
        self.exe = py_spy_exe()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if every_s > 0 and Path(self.exe).exists():
            self._thread = threading.Thread(target=self._run, name="stack-dumps", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.now()

    def now(self, why: str = "") -> None:
        if self.every_s <= 0 or not Path(self.exe).exists():
            return
        try:
            done = subprocess.run([self.exe, "dump", "--pid", str(self.pid), "--subprocesses", "--nonblocking"],
                                  capture_output=True, text=True, timeout=60)
            text = done.stdout + done.stderr
        except (OSError, subprocess.TimeoutExpired) as e:
            text = f"py-spy dump failed: {e}\n"
        with open(self.out, "a") as f:
            f.write(f"===== {time.strftime('%H:%M:%S')} {why}\n{text}\n")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(70)


def keep_off(cpu: int | None) -> Callable[[], None]:
    """From now on the calling thread, and the client processes it starts, keep off `cpu` (the
    daemon's engine CPU, `serve --thread-cpu`: clients stand for users on other machines and must
    not take the core the daemon reserved); returns what restores it. None: nothing changes."""
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return lambda: None
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, allowed - {cpu})
    return lambda: os.sched_setaffinity(0, allowed)


def wait_idle(url: str, timeout: float = 60) -> None:
    """Until the daemon has no open streams (the previous level is gone)."""
    deadline = time.time() + timeout
    while scrape(url).get("streamd_streams_active", 0.0) > 0 and time.time() < deadline:
        time.sleep(0.2)


# -- levels ------------------------------------------------------------------------------------

def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    a = np.asarray(values)
    return {"n": int(a.size), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def run_level(url: str, n: int, audios: list[Audio], args: argparse.Namespace,
              pool: ProcessPoolExecutor | None) -> dict[str, Any]:
    """N concurrent streams; returns the level's summary."""
    wait_idle(url)
    before = scrape(url)
    send_s = args.send_ms / 1000
    start_at = time.time() + 1.0
    if pool is None:
        stats = asyncio.run(run_streams(url, list(range(n)), audios, args.seconds, send_s, start_at, args.ramp_s))
    else:
        shares = [list(range(p, n, args.client_procs)) for p in range(args.client_procs)]
        futures = [pool.submit(_worker, url, s, audios, args.seconds, send_s, start_at, args.ramp_s)
                   for s in shares if s]
        stats = [StreamStats(**d) for f in futures for d in f.result()]
    after = scrape(url)
    return summarize(n, stats, before, after, args)


def summarize(n: int, stats: list[StreamStats], before: dict[str, float], after: dict[str, float],
              args: argparse.Namespace) -> dict[str, Any]:
    limit = args.max_latency_s
    errors = [s.error for s in stats if s.error]
    kept_up = [s for s in stats if s.error is None and s.drain is not None and s.drain <= limit
               and (not s.lag or float(np.percentile(s.lag, 95)) <= limit)]
    partial = percentiles([x for s in stats for x in s.partial_latency])
    final = percentiles([x for s in stats for x in s.final_latency])
    late = max((s.send_late_max for s in stats), default=0.0)
    server: dict[str, float | None] = {}
    for h in HISTOGRAMS:
        count = after.get(h + "_count", 0.0) - before.get(h + "_count", 0.0)
        total = after.get(h + "_sum", 0.0) - before.get(h + "_sum", 0.0)
        server[h.removeprefix("streamd_") + "_mean"] = total / count if count else None
    client_bound = late > args.max_send_late_s
    passed = (not errors and len(kept_up) == n and not client_bound
              and all(p["p95"] is None or p["p95"] <= limit for p in (partial, final)))
    return {"streams": n, "passed": passed, "kept_up": len(kept_up), "errors": len(errors),
            "first_error": errors[0] if errors else None, "client_bound": client_bound,
            "partial_latency_s": partial, "final_latency_s": final,
            "lag_s": percentiles([x for s in stats for x in s.lag]),
            "drain_s": percentiles([s.drain for s in stats if s.drain is not None]),
            "send_late_max_s": late, "server": server,
            "capacity_estimate": after.get("streamd_capacity_estimate_streams")}


def next_levels(args: argparse.Namespace) -> list[int]:
    levels, n = [], args.start
    while n < args.max_streams:
        levels.append(n)
        n = max(n + 1, int(n * args.factor))
    return levels + [args.max_streams]


def fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{x:6.3f}"


def print_row(level: dict[str, Any]) -> None:
    p, f, lag, d = level["partial_latency_s"], level["final_latency_s"], level["lag_s"], level["drain_s"]
    batch = level["server"]["batch_size_mean"]
    step = level["server"]["decode_step_seconds_mean"]
    est = level["capacity_estimate"]
    print(f"{level['streams']:7d} {level['kept_up']:7d} {fmt(p['p50'])} {fmt(p['p95'])} {fmt(f['p50'])} "
          f"{fmt(f['p95'])} {fmt(lag['p95'])} {fmt(d['max'])} {fmt(level['send_late_max_s'])} "
          f"{'   -  ' if batch is None else f'{batch:6.1f}'} {fmt(step)} "
          f"{'    -' if est is None else f'{est:5.0f}'}  "
          f"{'ok' if level['passed'] else 'FAIL'}{' (client-bound)' if level['client_bound'] else ''}"
          f"{' ' + level['first_error'] if level['first_error'] else ''}", flush=True)


HEADER = ("streams kept_up part50 part95 fin50  fin95  lag95  drainmx late   batch  step_s   est  result\n"
          "                (result latency, s)          (s, server-reported lag; client send lateness)"
          "          (est: the daemon's capacity estimate after the level)")


def machine_info() -> dict[str, Any]:
    """This machine: CPU model and cores, GPU (if torch sees one), torch and Python versions."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info: dict[str, Any] = {"hostname": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
                            "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                            "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        info["gpu_count"] = torch.cuda.device_count()
    except ImportError:
        info["torch"] = info["gpu"] = None
    return info


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wavs", nargs="*", type=Path, help="audio to loop, one file per stream in turn "
                   "(default: synthesised tone bursts)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="an already running daemon, ws://HOST:PORT")
    src.add_argument("--model", help="start a daemon with this model file (.nemo or .pt)")
    p.add_argument("--device", default="cpu", help="daemon device: cpu, cuda, cuda:N (default: cpu)")
    p.add_argument("--dtype", default="fp32", help="daemon dtype: fp32, bf16, fp16 (default: fp32)")
    p.add_argument("--daemon-args", default="", help="extra `streamd serve` flags, e.g. '--batch-wait-ms 20'")
    p.add_argument("--start", type=int, default=1, help="streams in the first level (default: 1)")
    p.add_argument("--factor", type=float, default=2.0, help="growth between levels (default: 2)")
    p.add_argument("--max-streams", type=int, default=256, help="last level; also the daemon's capacity (default: 256)")
    p.add_argument("--refine", type=int, default=2, help="bisection steps after the first failure (default: 2)")
    p.add_argument("--seconds", type=float, default=15.0, help="audio per stream and level (default: 15)")
    p.add_argument("--ramp-s", type=float, default=1.0, help="stream starts spread over this long (default: 1)")
    p.add_argument("--send-ms", type=int, default=100, help="audio per message (default: 100)")
    p.add_argument("--max-latency-s", type=float, help="pass/keep-up limit (default: chunk + 1 s)")
    p.add_argument("--max-send-late-s", type=float, default=0.25,
                   help="client lateness beyond which a level is inconclusive (default: 0.25)")
    p.add_argument("--client-procs", type=int, default=1, help="client processes sharing the streams (default: 1)")
    p.add_argument("--json", type=Path, default=Path("load.json"), help="where to write results (default: load.json)")
    args = p.parse_args(argv)
    if args.start < 1 or args.max_streams < args.start or args.factor <= 1:
        p.error("need 1 <= --start <= --max-streams and --factor > 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    audios = [load_wav(w) for w in args.wavs] or [tone_bursts()]
    daemon = None
    if args.model:
        daemon = Daemon(args.model, args.device, args.dtype, args.max_streams, shlex.split(args.daemon_args))
        print(f"starting streamd serve --model {args.model} --device {args.device} --dtype {args.dtype} ...", flush=True)
    keep_off(daemon.thread_cpu if daemon else None)  # for the client processes (this process ends with them)
    pool = (ProcessPoolExecutor(args.client_procs, mp_context=get_context("spawn"))
            if args.client_procs > 1 else None)
    t_begin = time.time()
    report: dict[str, Any] = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
                              "audio": [{"name": a.name, "rate": a.rate, "seconds": round(a.seconds, 3)} for a in audios]}
    try:
        url = daemon.wait_serving() if daemon else args.url.rstrip("/")
        report["capacity_estimate_at_start"] = scrape(url).get("streamd_capacity_estimate_streams")
        # One stream first: the daemon's placement and chunk size (and a warm-up).
        probe = asyncio.run(run_stream(url, 0, audios[0], looped(audios[0], 2.0), 2.0, args.send_ms / 1000,
                                       time.time()))
        if probe.ready is None or probe.ready.get("type") != "ready":
            raise RuntimeError(f"probe stream failed: {probe.error}")
        chunk_s = probe.ready["chunk_ms"] / 1000
        args.max_latency_s = args.max_latency_s or chunk_s + 1.0
        report["daemon"] = {k: probe.ready[k] for k in ("model", "device", "dtype", "chunk_ms")}
        report["daemon"].update(url=url, started_by_script=daemon is not None)
        print(f"daemon {url}: {report['daemon']['model']} on {report['daemon']['device']} "
              f"({report['daemon']['dtype']}), chunk {probe.ready['chunk_ms']} ms; limit "
              f"{args.max_latency_s:.2f} s; {args.seconds:g} s per level\n{HEADER}", flush=True)
        levels: list[dict[str, Any]] = []
        best, worst = 0, None
        for n in next_levels(args):
            level = run_level(url, n, audios, args, pool)
            levels.append(level)
            print_row(level)
            if level["passed"]:
                best = n
            else:
                worst = n
                break
        for _ in range(args.refine):
            if worst is None or (n := (best + worst) // 2) <= best:
                break
            level = run_level(url, n, audios, args, pool)
            levels.append(level)
            print_row(level)
            best, worst = (n, worst) if level["passed"] else (best, n)
        report.update(levels=levels, max_realtime_streams=best, first_failing=worst,
                      max_latency_s=args.max_latency_s, wall_s=round(time.time() - t_begin, 1))
        bound = "" if worst is not None else f" (never failed up to --max-streams {args.max_streams})"
        print(f"max streams served in real time: {best}{bound}; the daemon estimated "
              f"{report['capacity_estimate_at_start']} at warm-up; {report['wall_s']} s")
    finally:
        if pool is not None:
            pool.shutdown()
        if daemon is not None:
            report["daemon_exit_code"] = daemon.stop()
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
