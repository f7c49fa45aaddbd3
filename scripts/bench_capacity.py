#!/usr/bin/env python3
"""Capacity: streams kept real time by the bare engine step, by the daemon's engine alone with
live streams, and by the daemon end to end, side by side in one run, per chunk size, dtype and
CUDA graphs on/off.

* engine: one `Recognizer` (the daemon's encoder and decoder step factories) steps N streams
  that all have a chunk ready, in this process; N is kept real time when its steps (audio in,
  features, encoder, decoder, results delivered as the daemon's engine thread delivers them to
  `--workers` front ends), pipelined as the daemon's engine does (each launched while the one
  before runs on the device, then the one before collected), take at most one chunk each. Each
  level also reports the median step alone (synchronised: every step reads its
  labels back before the next begins), the measure of the runs before 2026-12-05e. N doubles from
  `--engine-start`, then bisects. An upper bound: no churn, every step full.
* live: the fair denominator for the daemon (`scripts/live_engine.py`): the daemon's own `Engine`
  (built and warmed up from the same `streamd serve` flags, `--daemon-args` included, so steps
  are batched and pipelined as in the daemon) with N live streams fed in real time from the
  same process, no websockets: every stream lasts `--stream-s` (default `--seconds`) of audio,
  then ends and a new one opens, so the live count stays at N (N / stream_s opens per second),
  for `--live-s` per level. A level passes when every stream opened kept up (drain and p95 lag
  at most chunk + `--slack-s`) and the p95 result latency is at most that. Levels are searched as
  the daemon's are (or `--live-at`); each reports streams opened and kept up, step time p50 / p95
  and mean batch.
* daemon: `scripts/load.py`'s method: a real `streamd serve` on the same model, placement and
  chunk, and real websocket clients in `--client-procs` processes sending audio in real time; a
  level of N streams (each `--seconds` long, their starts spread over `--ramp-s`) passes when
  every stream kept up and the p95 partial and final latencies are at most chunk + `--slack-s`
  (0.25 s). Levels start at `--daemon-first` x the engine's capacity, then go up to `--above` x
  it (default 1) or bisect down. Each level reports the clients' CPU use (and cores), the
  daemon's, its mean step and batch, and the step time p50 / p95 as bounds of the daemon's
  histogram buckets. With
  `--daemon-churn` a level churns as a live one does: N streams of `--stream-s` for `--live-s`,
  each replaced (by a new connection) as it ends; every stream opened must keep up.

Every part is time-boxed: the plan's items run in order while `--budget-s` lasts, each within its
own cap, so that one GPU call covers the important ones (160 and 1120 ms chunks, bf16, engine,
live and daemon) and adds the rest (graphs off, fp32) when time allows. Prints two tables
(capacities; every live and daemon level), writes JSON.

The model is a random FastConformer-L sized hybrid (114 M parameters, `bench_model.make_model`)
unless `--model` is given.

    python scripts/bench_capacity.py --out capacity.json
    python scripts/bench_capacity.py --plan engine:1120:bf16:on,daemon:1120:bf16:on --budget-s 120
    python scripts/bench_capacity.py --device cpu --model M.nemo --plan engine:1120:fp32:on --engine-start 16
    python scripts/bench_capacity.py --device cpu --plan live:160:fp32:off --live-at 160=8/16 --stream-s 1 \\
        --live-s 3 --warmup-s 1 --model tests/fixtures/nemo-tiny/tiny_streaming_fastconformer_hybrid.nemo

Issue 29 on one H200 (bf16, graphs on, 8 front ends). One call: engine, live and daemon at both
chunks with streams of 8 s (the daemon's levels as before: one cohort of 8 s streams started
over 3 s; add --daemon-churn for the live item's churn). Then streams of 60 s, live and daemon
with the same churn, one call per chunk, at levels set from the first call's results:

    python3 scripts/bench_capacity.py --plan engine:160:bf16:on,live:160:bf16:on,daemon:160:bf16:on,engine:1120:bf16:on,live:1120:bf16:on,daemon:1120:bf16:on \\
        --engine-start 4096 --engine-max 16384 --engine-refine 2 --engine-cap-s 45 --live-cap-s 75 \\
        --daemon-cap-s 110 --seconds 8 --live-s 10 --warmup-s 2 --workers 8 --client-procs 6 \\
        --daemon-args "--batch-wait-ms=2 --admission=max_streams" --budget-s 480 --out capacity-8s.json
    python3 scripts/bench_capacity.py --plan live:160:bf16:on,daemon:160:bf16:on --live-at 160=9600/12288 \\
        --daemon-at 160=9600/12288 --daemon-churn --stream-s 60 --live-s 30 --warmup-s 2 --live-cap-s 150 \\
        --daemon-cap-s 240 --workers 8 --client-procs 6 --daemon-args "--batch-wait-ms=2 --admission=max_streams" \\
        --budget-s 480 --out capacity-60s-160ms.json
    (the same with 1120 in place of 160, --live-at 1120=12800/16384 --daemon-at 1120=12800/16384)
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import load  # noqa: E402  (scripts/load.py: the daemon load test's machinery)

CHUNK_RC = {80: 0, 160: 1, 560: 6, 1120: 13}  # chunk ms -> right context
PARTS = ("engine", "live", "daemon")
DEFAULT_PLAN = ("engine:160:bf16:on,daemon:160:bf16:on,engine:1120:bf16:on,daemon:1120:bf16:on,"
                "live:160:bf16:on,live:1120:bf16:on,"
                "engine:160:bf16:off,engine:1120:bf16:off,engine:160:fp32:on,engine:1120:fp32:on,"
                "daemon:160:fp32:on,daemon:1120:fp32:on")


@dataclass(frozen=True)
class Item:
    """One plan item: what to measure (engine or daemon) for one configuration."""

    part: str
    chunk_ms: int
    dtype: str
    graphs: str

    @classmethod
    def parse(cls, text: str) -> Item:
        part, chunk, dtype, graphs = text.split(":")
        if part not in PARTS or int(chunk) not in CHUNK_RC or graphs not in ("on", "off"):
            raise ValueError(f"bad plan item {text!r}: PART:CHUNK_MS:DTYPE:on|off, PART {'|'.join(PARTS)}, "
                             f"CHUNK_MS one of {sorted(CHUNK_RC)}")
        return cls(part, int(chunk), dtype, graphs)

    @property
    def config(self) -> tuple[int, str, str]:
        return self.chunk_ms, self.dtype, self.graphs

    def __str__(self) -> str:
        return f"{self.part} {self.chunk_ms} ms {self.dtype} graphs {self.graphs}"


# -- engine only -------------------------------------------------------------------------------

def per_stream_bytes(model: Any, att_context: tuple[int, int]) -> int:
    """Slot state of one stream (the serving layout: key/value rings and conv caches) at the
    model's dtype, as a migration counts it (`migration.target_bytes`)."""
    from streamd.engine.migration import target_bytes

    return target_bytes(model, model.dtype, 1, att_context) - target_bytes(model, model.dtype, 0, att_context)


PIPELINED_STEPS = 8  # launched back to back: the mean of the 6 steady intervals between their collections


def deliver(results: Any, sessions: list[Any], front_ends: int) -> list[Any]:
    """What the daemon's engine thread makes of a landed step's `StepResults` (row i: stream i,
    whose `EngineSession` is sessions[i]): with front ends, each one's rows as its channel's frame
    (`Bridge._deliver`: `front_messages`, the socket write left out; the front end makes each
    stream's `ChunkResult` of them), stream i for front end i % front_ends; without, every row's
    `ChunkResult` (the in-process sessions' queue items)."""
    from streamd.engine.types import Handover
    from streamd.server.channel import _frame
    from streamd.server.frontends import front_messages

    if not front_ends:
        return results.chunks()  # type: ignore[no-any-return]
    frames = []
    for f in range(front_ends):
        rows = np.arange(f, len(results), front_ends, dtype=np.int64)
        handover = Handover(sessions[f::front_ends][:rows.size], results.rows(rows), [])
        frames.append(_frame(front_messages(handover)))
    return frames


def engine_capacity(model_path: Path, item: Item, args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    """Largest N whose median engine step over N ready streams takes at most one chunk."""
    import torch

    from streamd.decoding.graphs import EAGER, make_decoder
    from streamd.engine.encoder_step import make_encoder_step
    from streamd.engine.migration import placed_copy
    from streamd.engine.placement import parse_device, parse_dtype
    from streamd.engine.recognizer import PART_ROWS, Recognizer
    from streamd.engine.types import EngineSession
    from streamd.model.checkpoint import load_model
    from streamd.server.app import DECODER_BUCKETS_PER_OCTAVE

    t_begin = time.monotonic()
    deadline = t_begin + seconds
    device = parse_device(args.device)
    loaded = load_model(model_path)
    att_context = loaded.model.dims.att_context_with_right(CHUNK_RC[item.chunk_ms])
    model = placed_copy(loaded.model, device, parse_dtype(item.dtype))
    del loaded
    max_n = args.engine_max
    if device.type == "cuda":  # slot state + the encoder's static windows for as many rows, with room
        # (peak 55.7 GB for 10621 slots at 160 ms on an H100: 2.0x their slot state; this keeps
        # the peak near 70 % of what is free)
        free, _ = torch.cuda.mem_get_info(device)
        max_n = min(max_n, int(0.6 * free / (1.75 * per_stream_bytes(model, att_context))))
    mode = "auto" if item.graphs == "on" else EAGER
    rec = Recognizer(model, capacity=max_n, att_context=att_context,
                     search_factory=lambda m: make_decoder(m, mode, per_octave=DECODER_BUCKETS_PER_OCTAVE),
                     encoder_factory=lambda m: make_encoder_step(m, mode, max_n),
                     keep_transcripts=False,  # as the daemon's engine (streamd.server.app): front ends keep them
                     part_rows=args.part_rows or PART_ROWS)
    chunk_s = rec.geometry.chunk_ms / 1000
    rng = np.random.default_rng(0)
    tone = np.frombuffer(load.tone_bursts(seconds=20.0).pcm, dtype="<i2").astype(np.float32) / 32768
    # What the streams send, 256 MB of it (more than any CPU's cache: the engine thread's copy into
    # the rings reads memory another core wrote, as the daemon's reads a front end's pipe): each
    # step's chunk of stream i is copied straight from its place in it (`push_many`), one copy, as the
    # daemon's engine thread copies a front end's message. No other thread runs beside the engine
    # thread (in the daemon's process none does): a thread gathering the chunks a step ahead
    # (e17eb9e) took the GIL from the launches, 31 -> 70 ms a step at 10240 (benchmarks/h100-2026-12-07m).
    source = np.tile(tone, -(-(64 << 20) // tone.size))
    streams: list[Any] = []
    sessions = [EngineSession(id=i) for i in range(max_n)]  # stream i's, as a front end's bridge keeps them
    offsets = rng.integers(0, source.size - 1, max_n)  # stream i's place in the source
    g = rec.geometry
    chunk = g.hop * g.subsampling * (g.right + 1)

    def feed_all() -> None:
        """A chunk for every stream in one `push_many`, as the engine takes a front end's message."""
        n = len(streams)
        at = offsets[:n] % (source.size - chunk)
        offsets[:n] += chunk
        slots = np.fromiter((s.slot for s in streams), np.int64, n)
        rec.audio.push_many(slots, at, np.full(n, chunk, np.int64), source)

    def probe(n: int) -> dict[str, Any]:
        while len(streams) < n:
            s = rec.open()
            # one chunk ahead, as a real-time client is: every step has a full chunk (its first takes
            # fewer frames), and each chunk fed fits in the ring beside the one a launch holds
            s.push_audio(tone[:chunk])
            streams.append(s)
        while len(streams) > n:
            rec.close(streams.pop())
        times: list[float] = []
        warm = 2  # the first captures this batch size's graphs
        steps = warm + (3 if n >= 2048 else 5)
        for _ in range(steps):
            feed_all()
            assert all(s.ready for s in streams)
            t0 = time.perf_counter()
            rec.step(streams)
            times.append(time.perf_counter() - t0)
            if time.monotonic() > deadline and len(times) > warm:
                break
        measured = times[warm:] or times[-1:]
        step = statistics.median(measured)
        piped, host = pipelined(PIPELINED_STEPS)
        row = {"streams": n, "step_s": round(piped, 4), "unpipelined_step_s": round(step, 4), "pipelined": host,
               "unpipelined_step_max_s": round(max(measured), 4), "first_step_s": round(times[0], 4),
               "steps": len(measured), "pipelined_steps": PIPELINED_STEPS, "passed": piped <= chunk_s,
               "queued": int(rec.audio.queued.sum()),  # streams whose audio waits outside their ring (0)
               "encoder": rec.encoder_step.mode, "decoder": getattr(rec.search, "mode", "eager")}
        print(f"  engine {n:6d} streams: step {piped:.3f} s pipelined, {step:.3f} s alone (max {max(measured):.3f}, "
              f"first {times[0]:.3f}) {'ok' if row['passed'] else 'too slow'} [{row['encoder']}/{row['decoder']}]",
              flush=True)
        print("    pipelined step's medians: " + ", ".join(f"{k[:-2]} {v * 1e3:.1f} ms" for k, v in host.items()), flush=True)
        return row

    def pipelined(steps: int) -> tuple[float, dict[str, float]]:
        """Seconds a step of every stream, stepped as the daemon's engine does: each step is
        launched while the one before runs on the device, then the one before is collected.
        The mean time between two collected steps (the pipeline's steady state, as a daemon
        stepping all the time runs: not its filling, a feed and launch with nothing to overlap,
        nor its draining, a wait for the last step with nothing launched behind it). Also the
        median of each part of a step on the host (feeding: copying the chunks into the rings;
        launching, of which waiting for the step before's ring reads; collecting; delivering the
        results) and of the device's time a step (CUDA only; the step's span on the device after
        the one before ended)."""
        parts: dict[str, list[float]] = {k: [] for k in ("feed_s", "launch_s", "ring_wait_s", "collect_s",
                                                          "deliver_s", "device_s")}

        done: list[float] = []  # when each step's results were delivered

        def collected(step: Any, before: Any) -> None:
            t = time.perf_counter()
            results = step.collect()
            parts["collect_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            deliver(results, sessions, args.workers)
            done.append(time.perf_counter())
            parts["deliver_s"].append(done[-1] - t)
            if (device_s := step.device_s(before)) is not None:
                parts["device_s"].append(device_s)

        running = before = None
        for _ in range(steps):
            t = time.perf_counter()
            feed_all()
            parts["feed_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            launched = rec.launch(streams)
            parts["launch_s"].append(time.perf_counter() - t)
            parts["ring_wait_s"].append(launched.ring_wait_s)
            if running is not None:
                collected(running, before)
            before, running = running, launched
        assert running is not None
        collected(running, before)
        # each interval a feed, a launch and a collect (the last collect only drains); their mean, as
        # an interval's wait can shift time to the next one (a median of intervals can fall below it)
        steady = (done[-2] - done[0]) / (len(done) - 2)
        return steady, {k: round(statistics.median(v), 4) for k, v in parts.items() if v}

    probes: list[dict[str, Any]] = []
    best, worst = 0, None
    n = min(args.engine_start, max_n)
    try:
        while time.monotonic() < deadline:  # up by doubling, or down by halving if the first fails
            row = probe(n)
            probes.append(row)
            if row["passed"]:
                best = n
                if worst is not None or n >= max_n:
                    break
                n = min(2 * n, max_n)
            else:
                worst = n
                if best or n <= 16:
                    break
                n //= 2
        for _ in range(args.engine_refine):  # bisect, in steps of 64 streams (16 below 1024)
            if worst is None or time.monotonic() > deadline:
                break
            grain = 64 if best >= 1024 else 16
            n = (best + worst) // 2 // grain * grain
            if n <= best:
                break
            row = probe(n)
            probes.append(row)
            best, worst = (n, worst) if row["passed"] else (best, n)
        enc = rec.encoder_step
        result = {"capacity": best, "first_failing": worst, "max_tried_limit": max_n, "chunk_s": chunk_s,
                  "probes": probes, "part_rows": rec.part_rows, "encoder_buckets": enc.buckets,
                  "encoder_fallbacks": enc.fallbacks,
                  "encoder_last_capture_ms": round(enc.last_capture_ms, 1),
                  "bounded_by_time": time.monotonic() > deadline, "wall_s": round(time.monotonic() - t_begin, 1)}
        if device.type == "cuda":
            result["peak_gpu_mem_gb"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        return result
    finally:
        streams.clear()
        del rec, model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)


# -- engine alone, live streams -----------------------------------------------------------------

def live_capacity(model_path: Path, item: Item, guess: int, args: argparse.Namespace, seconds: float
                  ) -> dict[str, Any]:
    """Levels of live streams with churn through the daemon's own engine (`live_engine.py`),
    searched as the daemon's levels are, around the engine's capacity `guess`."""
    return asyncio.run(_live_capacity(model_path, item, guess, args, seconds))


async def _live_capacity(model_path: Path, item: Item, guess: int, args: argparse.Namespace, seconds: float
                         ) -> dict[str, Any]:
    import torch

    import live_engine

    t_begin = time.monotonic()
    deadline = t_begin + seconds
    search = LevelSearch.around(fixed_levels(args.live_at, item), guess, args.daemon_first, args.above)
    fixed, first, top = search.fixed, search.first, search.top
    # slots for the streams that end while the ones replacing them open, as the daemon's top + 64
    cfg = live_engine.serve_config(model_path, args.device, item.dtype, top + top // 8 + 64,
                                   ["--right-context", str(CHUNK_RC[item.chunk_ms]), "--cuda-graphs", item.graphs,
                                    *args.daemon_args.split()])
    switch = sys.getswitchinterval()  # the engine sets the daemon's (engine.gil_switch_ms)
    try:
        engine, metrics = await live_engine.start_engine(cfg)
    except BaseException:
        sys.setswitchinterval(switch)
        raise
    chunk_s = engine.recognizer.geometry.chunk_ms / 1000
    stream_s = args.stream_s or args.seconds
    audio = np.frombuffer(load.tone_bursts(seconds=20.0).pcm, dtype="<i2").astype(np.float32) / 32768

    async def level(n: int, level_s: float) -> dict[str, Any]:
        return await live_engine.run_level(engine, metrics, n, level_s=level_s, stream_s=stream_s,
                                           send_s=args.send_ms / 1000, audio=audio, limit_s=chunk_s + args.slack_s,
                                           max_late_s=args.max_send_late_s)

    try:
        print(f"  live engine: warm-up level of {first} streams for {args.warmup_s:g} s (not counted); "
              f"streams of {stream_s:g} s, levels of {args.live_s:g} s", flush=True)
        warmup = await level(first, args.warmup_s)
        print(f"  {live_engine.HEADER}", flush=True)
        n: int | None = first
        level_cost = args.live_s + chunk_s + args.slack_s + 2
        while n is not None and time.monotonic() + level_cost < deadline and len(search.levels) < (len(fixed) or args.daemon_levels):
            row = await level(n, args.live_s)
            print(f"  {live_engine.format_row(row)}", flush=True)
            n = search.record(n, row)
        return {"capacity": search.best, "first_failing": search.worst, "chunk_s": chunk_s, "stream_s": stream_s,
                "max_latency_s": round(chunk_s + args.slack_s, 3), "levels": search.levels, "warmup_level": warmup,
                "slots": engine.recognizer.capacity, "bounded_by_time": time.monotonic() + level_cost >= deadline,
                "wall_s": round(time.monotonic() - t_begin, 1)}
    finally:
        await engine.stop()
        device = engine.recognizer.model.device
        del engine
        gc.unfreeze()  # the startup heap `start_engine` froze, as the daemon does
        sys.setswitchinterval(switch)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


# -- daemon end to end -------------------------------------------------------------------------

def client_worker(url: str, indices: list[int], audios: list[load.Audio], seconds: float, send_s: float,
                  start_at: float, ramp_s: float) -> tuple[list[dict[str, Any]], float]:
    """One client process's share of a level: (stream stats, CPU seconds this process used)."""
    c0 = time.process_time()
    stats = load._worker(url, indices, audios, seconds, send_s, start_at, ramp_s)
    return stats, time.process_time() - c0


def churn_worker(url: str, indices: list[int], n: int, audios: list[load.Audio], stream_s: float, level_s: float,
                 send_s: float, start_at: float) -> tuple[list[dict[str, Any]], float]:
    """`client_worker` for `--daemon-churn`: client slots `indices` of N each run streams of
    `stream_s` back to back (each a new connection) until `level_s` after `start_at`, as the live
    item's streams: the first streams' lengths spread over (0, stream_s], their starts over one
    message, so that about N / stream_s streams open per second; the last are cut at the level's end."""
    async def slot(i: int) -> list[load.StreamStats]:
        audio = audios[i % len(audios)]
        pcm = load.looped(audio, stream_s)
        out: list[load.StreamStats] = []
        at, seconds = start_at + send_s * i / n, stream_s * (i + 1) / n
        while seconds >= send_s / 2:
            out.append(await load.run_stream(url, i, audio, pcm, seconds, send_s, at))
            at = time.time()
            seconds = min(stream_s, start_at + level_s - at)
        return out

    async def level() -> list[load.StreamStats]:
        return [st for part in await asyncio.gather(*map(slot, indices)) for st in part]

    c0 = time.process_time()
    stats = [asdict(st) for st in asyncio.run(level())]
    return stats, time.process_time() - c0


def process_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) used so far by a process, and by its child processes (the
    daemon's front ends) that are alive now."""
    def stat(p: int) -> list[str]:
        return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()

    tick = os.sysconf("SC_CLK_TCK")
    own = stat(pid)
    children = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != pid:
            try:
                f = stat(int(entry.name))
            except OSError:
                continue
            if int(f[1]) == pid:
                children += (int(f[11]) + int(f[12])) / tick
    return (int(own[11]) + int(own[12])) / tick, children


def run_level(url: str, n: int, audios: list[load.Audio], args: argparse.Namespace, pool: ProcessPoolExecutor,
              daemon_pid: int) -> dict[str, Any]:
    """load.py's level (N real-time streams), plus the CPU used by the clients and the daemon."""
    load.wait_idle(url)
    before, buckets, paths = load.scrape(url), step_buckets(url), labelled(url, AUDIO_MESSAGES)
    send_s = args.send_ms / 1000
    start_at = time.time() + 1.0
    procs = min(args.client_procs, n)
    shares = [list(range(p, n, procs)) for p in range(procs)]
    t0, (d0, f0) = time.monotonic(), process_cpu_s(daemon_pid)
    if args.daemon_churn:
        futures = [pool.submit(churn_worker, url, s, n, audios, args.stream_s or args.seconds, args.live_s, send_s,
                               start_at) for s in shares]
    else:
        futures = [pool.submit(client_worker, url, s, audios, args.seconds, send_s, start_at, args.ramp_s)
                   for s in shares]
    results = [f.result() for f in futures]
    d1, f1 = process_cpu_s(daemon_pid)
    wall, daemon_cpu, fronts_cpu = time.monotonic() - t0, d1 - d0, f1 - f0
    stats = [load.StreamStats(**d) for r in results for d in r[0]]
    client_cpu = sum(r[1] for r in results)
    after = load.scrape(url)
    level = {**load.summarize(len(stats), stats, before, after, args), "streams": n, "opened": len(stats)}
    level["server"]["decode_step_seconds_at_most"] = bucket_quantiles(buckets, step_buckets(url))
    # inline: samples sent in the channel message, the front end's pipe full (the engine thread behind)
    level["server"]["audio_messages"] = {k: v - paths.get(k, 0.0) for k, v in labelled(url, AUDIO_MESSAGES).items()}
    level["load_generator"] = {"processes": procs, "cpu_s": round(client_cpu, 1), "wall_s": round(wall, 1),
                               "cores_used": round(client_cpu / wall, 2),
                               "max_process_cores": round(max(r[1] for r in results) / wall, 2)}
    level["daemon_cpu"] = {"cpu_s": round(daemon_cpu, 1), "cores_used": round(daemon_cpu / wall, 2),
                           "front_ends_cores_used": round(fronts_cpu / wall, 2), "front_ends": args.workers}
    return level


def labelled(url: str, prefix: str) -> dict[str, float]:
    """The daemon's samples of one metric with one label, by label value: /metrics lines
    `{prefix}"VALUE"} COUNT`."""
    http = url.replace("ws", "http", 1) + "/metrics"
    with urllib.request.urlopen(http, timeout=10) as r:
        text = r.read().decode()
    return {line[len(prefix):].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix)}


def step_buckets(url: str) -> dict[float, float]:
    """The daemon's step-time histogram (`streamd_decode_step_seconds`): steps so far at most
    each bucket's bound."""
    return {float(le): n for le, n in labelled(url, 'streamd_decode_step_seconds_bucket{le="').items()}


AUDIO_MESSAGES = 'streamd_front_audio_messages_total{path="'  # front ends' audio messages by path


def bucket_quantiles(before: dict[float, float], after: dict[float, float]) -> dict[str, float | str | None]:
    """p50 and p95 of the steps between two `step_buckets`, as the bounds of their buckets (the
    histogram's resolution: a factor of 2)."""
    counts = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = counts[-1][1] if counts else 0.0
    bounds = [le for le, _ in counts if le != float("inf")]

    def bound(q: float) -> float | str | None:
        le = next(le for le, c in counts if c >= q * total)
        return le if le != float("inf") else f"> {bounds[-1]}"
    return {f"p{round(100 * q)}": bound(q) if total else None for q in (0.5, 0.95)}


def next_level(n: int, passed: bool, best: int, worst: int | None, top: int, levels: list[dict[str, Any]]
               ) -> int | None:
    """The level after N (which `passed` or not) of a search up to `top` streams: up to `top`,
    then bisecting between the best passing and the worst failing level, in steps of 16 streams;
    None when done (as many as the engine alone keeps real time, or no new level 5 % away)."""
    if passed:
        if worst is None and n >= top:
            return None
        nxt = top if worst is None else (best + worst) // 2
    else:
        nxt = (best + worst) // 2 if best else n // 2
    nxt = nxt // 16 * 16
    if nxt < 16 or nxt == n or any(lv["streams"] == nxt for lv in levels) or abs(nxt - n) < 0.05 * n:
        return None
    return nxt


@dataclass
class LevelSearch:
    """The levels of one item's search: the asked ones (`fixed`) in order however each went, else
    from the first up to `top` and bisecting (`next_level`); `best` passed (every time it ran: ask
    a level twice, `--daemon-at 160=4096/4096`, to call it passed only if it repeats), `worst` failed."""

    fixed: list[int]
    first: int
    top: int
    best: int = 0
    worst: int | None = None

    def __post_init__(self) -> None:
        self.levels: list[dict[str, Any]] = []

    @classmethod
    def around(cls, fixed: list[int], guess: int, share: float, above: float = 1.0) -> LevelSearch:
        """The asked levels, or a search from `share` of the engine's capacity `guess` up to
        `above` times it."""
        first = fixed[0] if fixed else max(16, int(share * guess) // 16 * 16)
        return cls(fixed, first, max(first, int(above * guess) // 16 * 16, *fixed))

    def record(self, n: int, row: dict[str, Any]) -> int | None:
        """Keep level `n`'s row; the next level to run, or None when the search is done."""
        self.levels.append(row)
        if not row["passed"]:
            self.worst = n if self.worst is None else min(self.worst, n)
        runs: dict[int, bool] = {}
        for level in self.levels:
            runs[level["streams"]] = runs.get(level["streams"], True) and level["passed"]
        self.best = max((m for m, passed in runs.items() if passed), default=0)
        if self.fixed:
            return self.fixed[len(self.levels)] if len(self.levels) < len(self.fixed) else None
        return next_level(n, row["passed"], self.best, self.worst, self.top, self.levels)


def fixed_levels(spec: str, item: Item) -> list[int]:
    """The levels `--daemon-at` / `--live-at` asks for at this item's chunk (and dtype)."""
    at = daemon_levels_at(spec)
    return at.get(f"{item.chunk_ms}:{item.dtype}", at.get(str(item.chunk_ms), []))


def daemon_levels_at(spec: str) -> dict[str, list[int]]:
    """`--daemon-at` "160=2400/3200,1120:fp32=4096": chunk ms (and dtype, which goes first) ->
    the daemon levels to run there."""
    out: dict[str, list[int]] = {}
    for part in filter(None, spec.split(",")):
        key, _, levels = part.partition("=")
        out[key] = [int(n) for n in levels.split("/")]
    return out


def print_level(level: dict[str, Any]) -> None:
    lg, dc = level["load_generator"], level["daemon_cpu"]
    load.print_row(level)
    print(f"          clients: {lg['processes']} processes, {lg['cores_used']} cores "
          f"(busiest {lg['max_process_cores']}); daemon {dc['cores_used']} cores (engine process) "
          f"+ {dc['front_ends_cores_used']} ({dc['front_ends']} front-end processes)", flush=True)
    if paths := level["server"].get("audio_messages"):
        print(f"          front ends' audio messages: {paths.get('shared', 0):.0f} shared, "
              f"{paths.get('inline', 0):.0f} inline (pipe full)", flush=True)


def daemon_capacity(model_path: Path, item: Item, guess: int, args: argparse.Namespace, seconds: float
                    ) -> dict[str, Any]:
    """Levels of real-time streams through a real daemon, around the engine's capacity `guess`."""
    t_begin = time.monotonic()
    deadline = t_begin + seconds
    search = LevelSearch.around(fixed_levels(args.daemon_at, item), guess, args.daemon_first, args.above)
    fixed, first, top = search.fixed, search.first, search.top
    daemon = load.Daemon(str(model_path), args.device, item.dtype, top + 64,
                         ["--right-context", str(CHUNK_RC[item.chunk_ms]), "--cuda-graphs", item.graphs,
                          "--workers", str(args.workers), *args.daemon_args.split()],
                         log_path=args.out.parent / f"daemon-{item.chunk_ms}ms-{item.dtype}.log")
    audios = [load.tone_bursts(seed=s) for s in range(4)]
    ns = argparse.Namespace(**vars(args))
    restore = load.keep_off(daemon.thread_cpu)  # `--daemon-args "--thread-cpu N"`: the clients keep off it
    pool = ProcessPoolExecutor(args.client_procs, mp_context=get_context("spawn"))
    try:
        url = daemon.wait_serving(timeout=max(30.0, deadline - time.monotonic()))
        probe = asyncio.run(load.run_stream(url, 0, audios[0], load.looped(audios[0], 2.0), 2.0,
                                                 args.send_ms / 1000, time.time()))
        if probe.ready is None or probe.ready.get("type") != "ready":
            raise RuntimeError(f"probe stream failed: {probe.error}")
        chunk_s = probe.ready["chunk_ms"] / 1000
        ns.max_latency_s = chunk_s + args.slack_s
        warm = argparse.Namespace(**{**vars(ns), "seconds": args.warmup_s, "live_s": args.warmup_s})
        print(f"  daemon {url}: warm-up level of {first} streams for {args.warmup_s:g} s (not counted)", flush=True)
        warmup = run_level(url, first, audios, warm, pool, daemon.proc.pid)
        print(f"  {load.HEADER}", flush=True)
        n: int | None = first
        level_cost = (args.live_s if args.daemon_churn else args.seconds + args.ramp_s) + 8
        while n is not None and time.monotonic() + level_cost < deadline and len(search.levels) < (len(fixed) or args.daemon_levels):
            spy = (load.py_spy(daemon.proc.pid, args.py_spy, args.out.parent / f"pyspy-{item.chunk_ms}ms-{n}.txt")
                   if not search.levels else None)
            level = run_level(url, n, audios, ns, pool, daemon.proc.pid)
            if spy is not None:
                spy.wait()
            print_level(level)
            n = search.record(n, level)
        return {"capacity": search.best, "first_failing": search.worst, "max_latency_s": ns.max_latency_s,
                "levels": search.levels, "warmup_level": warmup, "bounded_by_time": time.monotonic() + level_cost >= deadline,
                "wall_s": round(time.monotonic() - t_begin, 1)}
    finally:
        pool.shutdown()
        restore()
        code = daemon.stop()
        if code not in (0, None):
            print(f"  daemon exit code {code}; last log lines:\n    " + "\n    ".join(daemon.log), flush=True)


# -- the run -----------------------------------------------------------------------------------

def build_model(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    if args.model:
        return Path(args.model), {"path": args.model}
    from bench_model import make_model

    t0 = time.monotonic()
    path = Path(tempfile.mkdtemp()) / "fastconformer-l-random.pt"
    rate = make_model(path, 1024)
    from streamd.model.checkpoint import load_model

    m = load_model(path).model
    return path, {"path": "random FastConformer-L (bench_model.make_model)",
                  "parameters": sum(p.numel() for p in m.parameters()), "dims": m.dims.to_dict(),
                  "labels_per_frame": round(rate, 3), "build_s": round(time.monotonic() - t0, 1)}


def raise_fd_limit() -> None:
    """Thousands of sockets: the daemon and the client processes inherit the raised limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def summary_table(items: list[dict[str, Any]]) -> str:
    """One line per chunk, dtype and graphs: each part's capacity; the daemon's with the p95 partial
    latency of its slowest run at that level (a level asked twice ran twice)."""
    configs: dict[tuple[int, str, str], dict[str, Any]] = {}
    for r in items:
        configs.setdefault((r["chunk_ms"], r["dtype"], r["graphs"]), {})[r["part"]] = r
    lines = ["chunk  dtype graphs |   engine streams (step s) | live streams (p50 step s, batch) "
             "|  daemon streams (p95 partial s, clients: procs/cores) | daemon/engine | daemon/live"]
    for (chunk, dtype, graphs), parts in configs.items():
        e, lv, d = parts.get("engine"), parts.get("live"), parts.get("daemon")
        e_txt = l_txt = d_txt = "-"
        if e and "capacity" in e:
            at = next((p for p in e["probes"] if p["streams"] == e["capacity"]), None)
            e_txt = f"{e['capacity']}{'+' if e['first_failing'] is None else ''} ({at['step_s']:.3f})" if at else "0"
        if lv and "capacity" in lv:
            at = next((x for x in lv["levels"] if x["streams"] == lv["capacity"]), None)
            l_txt = (f"{lv['capacity']}{'+' if lv['first_failing'] is None else ''} "
                     f"({at['steps']['step_s']['p50']}, {at['steps']['mean_batch']})" if at else "0")
        if d and "capacity" in d:
            at = max((x for x in d["levels"] if x["streams"] == d["capacity"]),
                     key=lambda x: x["partial_latency_s"]["p95"] or 0.0, default=None)
            p95 = at["partial_latency_s"]["p95"] if at else None  # None: no partial result came (silence)
            d_txt = (f"{d['capacity']} ({'-' if p95 is None else f'{p95:.2f}'}, {at['load_generator']['processes']}/"
                     f"{at['load_generator']['cores_used']})" if at else "0")

        def ratio(base: dict[str, Any] | None) -> str:
            known = base and d and base.get("capacity") and "capacity" in d
            return f"{d['capacity'] / base['capacity']:.2f}" if known else "-"
        lines.append(f"{chunk:5d}  {dtype:5s} {graphs:6s} | {e_txt:>25s} | {l_txt:>32s} | {d_txt:>52s} | "
                     f"{ratio(e):>13s} | {ratio(lv):>11s}")
    return "\n".join(lines)


def levels_table(items: list[dict[str, Any]]) -> str:
    """Every counted level of the live and daemon items: streams kept real time, steps, batch."""
    lines = ["chunk  dtype graphs part   | streams  opened kept_up | step p50 / p95 s (daemon: bucket bounds) "
             "| mean step s | mean batch | result"]
    for r in items:
        for lv in r.get("levels", []) if r["part"] in ("live", "daemon") else []:
            if r["part"] == "live":
                st = lv["steps"]
                opened, steps = lv["opened"], f"{st['step_s']['p50']} / {st['step_s']['p95']}"
                mean, batch = st["mean_s"], st["mean_batch"]
            else:
                sv = lv["server"]
                q = sv.get("decode_step_seconds_at_most", {})
                opened, steps = lv.get("opened", lv["streams"]), f"<= {q.get('p50')} / <= {q.get('p95')}"
                mean = None if sv["decode_step_seconds_mean"] is None else round(sv["decode_step_seconds_mean"], 4)
                batch = None if sv["batch_size_mean"] is None else round(sv["batch_size_mean"], 1)
            lines.append(f"{r['chunk_ms']:5d}  {r['dtype']:5s} {r['graphs']:6s} {r['part']:6s} | {lv['streams']:7d} "
                         f"{opened:7d} {lv['kept_up']:7d} | {steps:>40s} | {str(mean):>11s} | {str(batch):>10s} | "
                         f"{'ok' if lv['passed'] else 'FAIL'}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model file (default: build a random FastConformer-L)")
    p.add_argument("--device", default="cuda", help="device for the engine and the daemon (default: cuda)")
    p.add_argument("--plan", default=DEFAULT_PLAN, help="items PART:CHUNK_MS:DTYPE:GRAPHS, in priority order")
    p.add_argument("--budget-s", type=float, default=330, help="time for the whole plan (default: 330)")
    p.add_argument("--engine-cap-s", type=float, default=45, help="most time for one engine item (default: 45)")
    p.add_argument("--daemon-cap-s", type=float, default=95, help="most time for one daemon item (default: 95)")
    p.add_argument("--engine-start", type=int, default=512, help="first engine level (default: 512)")
    p.add_argument("--engine-max", type=int, default=16384, help="largest engine level (default: 16384)")
    p.add_argument("--engine-refine", type=int, default=3, help="engine bisection steps (default: 3)")
    p.add_argument("--part-rows", type=int, help="engine: streams per launched part of a step (default: the "
                   "daemon's, streamd.engine.recognizer.PART_ROWS)")
    p.add_argument("--daemon-first", type=float, default=0.8,
                   help="first daemon (and live) level, as a fraction of the engine's capacity (default: 0.8)")
    p.add_argument("--above", type=float, default=1.0,
                   help="highest daemon (and live) level searched, as a multiple of the engine's capacity "
                        "(default: 1.0)")
    p.add_argument("--daemon-levels", type=int, default=3, help="most daemon (and live) levels per item (default: 3)")
    p.add_argument("--daemon-at", default="", help="run exactly these daemon levels instead of a search, "
                   "per chunk ms or chunk:dtype, e.g. '160=2400/3200,1120:fp32=4096' (as time allows; a level "
                   "asked twice, '160=3200/3200', counts as passed only if both runs pass)")
    p.add_argument("--daemon-guess", type=int, default=1024,
                   help="engine capacity assumed when the plan has no engine result for a live or daemon item")
    p.add_argument("--live-cap-s", type=float, default=60, help="most time for one live item (default: 60)")
    p.add_argument("--live-at", default="", help="run exactly these live levels instead of a search, as --daemon-at")
    p.add_argument("--live-s", type=float, default=10.0, help="length of one live level (default: 10)")
    p.add_argument("--stream-s", type=float, default=None,
                   help="audio per live stream before it ends and another opens (default: --seconds)")
    p.add_argument("--seconds", type=float, default=8.0, help="audio per stream and daemon level (default: 8)")
    p.add_argument("--daemon-churn", action="store_true",
                   help="daemon levels as live ones: N streams of --stream-s for --live-s, each replaced as it ends "
                        "(a new connection), instead of N streams of --seconds started over --ramp-s")
    p.add_argument("--warmup-s", type=float, default=3.0, help="audio per stream of the uncounted first level")
    p.add_argument("--ramp-s", type=float, default=3.0, help="stream starts spread over this long (default: 3)")
    p.add_argument("--send-ms", type=int, default=100, help="audio per client message (default: 100)")
    p.add_argument("--slack-s", type=float, default=0.25, help="latency limit = chunk + this (default: 0.25)")
    p.add_argument("--max-send-late-s", type=float, default=0.25, help="client lateness that voids a level")
    p.add_argument("--client-procs", type=int, default=max(1, min(12, (os.cpu_count() or 4) - 4)),
                   help="client processes (default: cores - 4, at most 12)")
    p.add_argument("--workers", type=int, default=0,
                   help="the daemon's websocket front-end processes (server.workers; default: 0)")
    p.add_argument("--daemon-args", default="", help="more `streamd serve` flags, e.g. '--batch-wait-ms 2'")
    p.add_argument("--py-spy", type=float, default=0.0,
                   help="seconds of py-spy samples of the daemon in each item's first level (default: 0, off)")
    p.add_argument("--out", type=Path, default=Path("capacity.json"))
    args = p.parse_args(argv)
    args.items = [Item.parse(t) for t in args.plan.split(",") if t]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_fd_limit()
    t_begin = time.monotonic()
    deadline = t_begin + args.budget_s
    report: dict[str, Any] = {"machine": load.machine_info(), "args": {k: str(v) for k, v in vars(args).items()}}
    model_path, report["model"] = build_model(args)
    rate = report["model"].get("labels_per_frame")
    print(f"model: {report['model'].get('parameters', model_path)} parameters"
          f"{f', decodes {rate} labels a frame' if rate is not None else ''}; plan: "
          f"{', '.join(map(str, args.items))}; budget {args.budget_s:g} s", flush=True)
    results: list[dict[str, Any]] = []
    report["items"] = results
    for item in args.items:
        left = deadline - time.monotonic()
        cap = {"engine": args.engine_cap_s, "live": args.live_cap_s, "daemon": args.daemon_cap_s}[item.part]
        need = {"engine": 12, "live": args.live_s + args.warmup_s + 20,
                "daemon": args.seconds + args.ramp_s + args.warmup_s + 30}[item.part]
        row: dict[str, Any] = {"part": item.part, "chunk_ms": item.chunk_ms, "dtype": item.dtype,
                               "graphs": item.graphs}
        if left < need:
            row["skipped"] = f"out of time ({left:.0f} s left)"
            results.append(row)
            print(f"{item}: skipped, {left:.0f} s left", flush=True)
            continue
        print(f"{item}: up to {min(cap, left):.0f} s", flush=True)
        try:
            if item.part == "engine":
                # in a process of its own: the GPU memory it held (graph pools, caches) is given
                # back before a daemon needs it
                with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as one:
                    row.update(one.submit(engine_capacity, model_path, item, args, min(cap, left)).result())
            else:
                engine = next((r for r in results if r["part"] == "engine" and r.get("capacity")
                               and (r["chunk_ms"], r["dtype"], r["graphs"]) == item.config), None)
                guess = engine["capacity"] if engine else args.daemon_guess
                if item.part == "live":  # in a process of its own, as the engine item
                    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as one:
                        row.update(one.submit(live_capacity, model_path, item, guess, args, min(cap, left)).result())
                else:
                    row.update(daemon_capacity(model_path, item, guess, args, min(cap, left)))
        except Exception as e:  # noqa: BLE001 - report it and go on with the plan
            row["error"] = f"{type(e).__name__}: {e}"
            print(f"{item}: failed: {row['error']}", flush=True)
        results.append(row)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    report["wall_s"] = round(time.monotonic() - t_begin, 1)
    table = summary_table(results)
    report["table"] = table.splitlines()
    levels = levels_table(results)
    report["levels_table"] = levels.splitlines()
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{table}\n(engine: N ready streams stepped together, median step <= chunk; daemon: load.py levels, "
          f"p95 latency <= chunk + {args.slack_s} s; '+': never failed)\n\n{levels}\n(live: the daemon's engine "
          f"alone, N live streams of {args.stream_s or args.seconds:g} s with churn; opened: streams over the level)"
          f"\nwrote {args.out}; {report['wall_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
