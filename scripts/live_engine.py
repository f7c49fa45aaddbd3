"""Engine alone, served as the daemon serves it: the daemon's own `Engine` (built by
`server.app.build_state` from `streamd serve` flags and warmed by `app.warm_up`, so steps are
batched, pipelined and timed exactly as in the daemon) with N live streams fed in real time from
this process, without websockets or front ends.

A level keeps N streams live for `level_s` seconds with churn: every stream lasts `stream_s`
seconds of audio, then ends (`End`), and a new one opens in its place at once, so the live count
stays at N and about N / `stream_s` streams open (and as many end) per second. The first
streams' lengths are spread over (0, `stream_s`] so that the churn is steady from the start. Each
stream pushes `send_s` of audio at a time on its own schedule, as load.py's clients do (its
phase: one of `PHASES` evenly spread; a new stream takes the phase of the one it replaces). At
the end of the level every stream ends and is flushed.

Results go to one sink (the way a front end's bridge receives them) that only timestamps each
hand-over on the engine thread; everything is computed after the level. Per stream, as load.py
measures it: result latency (delivery minus when the audio up to the result's last frame was
pushed; that audio is the frame's end, at most the audio pushed, as a session reports it), lag
(audio pushed minus audio processed, at each result) and drain (end to flushed). Every step's
result counts (a daemon's client sees only the partials whose text changed). A stream keeps up
when it got no error and its drain and p95 lag are at most `limit_s`; a level passes when every
stream opened kept up, the p95 result latency is at most `limit_s` and the feeder itself was
never more than `max_late_s` late. Step times and batch sizes are the ones the daemon exports
(`Metrics.observe_step`, called by the engine after every step).
"""
from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import math
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamd.config import Config, add_arguments, load_config
from streamd.engine.engine import Engine
from streamd.engine.inbox import Audio, End, StreamCommand
from streamd.engine.types import EngineSession, Handover, ResultItem
from streamd.server.app import build_state, warm_up
from streamd.server.heap import freeze_startup_heap
from streamd.server.metrics import Metrics

PHASES = 10  # push schedules per `send_s`: the feeder wakes every send_s / PHASES


def serve_config(model: Path, device: str, dtype: str, max_streams: int, flags: list[str]) -> Config:
    """The Config `streamd serve` would build from these flags (load.Daemon's, without ports)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load_config(parser.parse_args(["--config", "", "--model", str(model), "--device", device, "--dtype", dtype,
                                          "--max-streams", str(max_streams), "--admin-socket", "", *flags]))


class StepMetrics(Metrics):
    """The daemon's metrics, also keeping every step's (when, seconds, batch) for percentiles."""

    def __init__(self) -> None:
        super().__init__(process=False)
        self.steps: list[tuple[float, float, int]] = []

    def observe_step(self, seconds: float, batch_size: int, chunk_seconds: float) -> None:
        self.steps.append((time.perf_counter(), seconds, batch_size))
        super().observe_step(seconds, batch_size, chunk_seconds)


@dataclass(eq=False)
class LiveStream:
    """One stream of a level: its schedule and what the engine handed back (perf_counter times)."""

    session: EngineSession
    pushes_total: int  # pieces of `send_s` it sends before it ends
    offset: int  # where in the audio it starts
    pushes: list[float] = field(default_factory=list)  # when audio [0, (k+1) send_s) had been pushed
    ended: float | None = None
    done: float | None = None
    results: list[tuple[float, int]] = field(default_factory=list)  # (delivered, frame_end)
    error: str | None = None
    opened: Future[None] | None = None  # the engine's answer to its open


FLUSHED, FAILED = -1, -2  # what `Deliveries` keeps of a stream's None and of a StreamFailed


class Deliveries:
    """The sessions' sink, on the engine thread: per hand-over its time and, per item, the
    stream's id and the result's last frame (or `FLUSHED`, `FAILED`): plain ints, so that a
    level's results do not pile up as objects for the garbage collector to scan."""

    def __init__(self) -> None:
        self.log: list[tuple[float, list[tuple[int, int]]]] = []
        self.errors: dict[int, str] = {}  # the StreamFailed messages, by stream id
        self._seen = self._finished = 0

    def __call__(self, handover: Handover) -> None:
        ends = handover.results.end.tolist() if handover.results is not None else []
        self.log.append((time.perf_counter(), [(s.id, end) for s, end in zip(handover.sessions, ends)]
                         + [(s.id, self._end(s, r)) for s, r in handover.ended]))

    def _end(self, session: EngineSession, item: ResultItem) -> int:
        if item is None:
            return FLUSHED
        self.errors[session.id] = str(item)
        return FAILED

    def finished(self) -> int:
        """Streams flushed or failed so far (on the feeder's side: counts the new hand-overs)."""
        end = len(self.log)
        for _, items in self.log[self._seen:end]:
            self._finished += sum(1 for _, frame in items if frame < 0)
        self._seen = end
        return self._finished


async def start_engine(cfg: Config) -> tuple[Engine, StepMetrics]:
    """The daemon's engine for `cfg`, started, warmed up (graphs captured) and its startup heap
    frozen, as `App.serve` does."""
    metrics = StepMetrics()
    engine = build_state(cfg, metrics).engine
    engine.start()
    try:
        await warm_up(engine)
    except BaseException:
        await engine.stop()
        raise
    freeze_startup_heap()
    return engine, metrics


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    a = np.asarray(values)
    return {"n": int(a.size), "p50": round(float(np.percentile(a, 50)), 4),
            "p95": round(float(np.percentile(a, 95)), 4), "max": round(float(a.max()), 4)}


async def run_level(engine: Engine, metrics: StepMetrics, n: int, *, level_s: float, stream_s: float,
                    send_s: float, audio: np.ndarray, limit_s: float, max_late_s: float = 0.25,
                    drain_timeout_s: float = 30.0) -> dict[str, Any]:
    """N live streams with churn for `level_s` seconds (see the module's docstring); the summary."""
    rate = engine.recognizer.geometry.sample_rate
    piece = int(rate * send_s)
    tick = send_s / PHASES
    sink = Deliveries()
    results: asyncio.Queue[ResultItem] = asyncio.Queue()  # never used: results go to the sink
    ids = itertools.count()
    streams: dict[int, LiveStream] = {}
    span = audio.size - piece

    def new_stream(seconds: float) -> LiveStream:
        session = EngineSession(id=next(ids), results=results, sink=sink)
        st = LiveStream(session, max(1, round(seconds / send_s)), session.id * 7919 % span)
        streams[session.id] = st
        opened = engine.open_session(session)

        def failed(f: Future[None]) -> None:
            if f.exception() is not None:
                st.error = f"open: {f.exception()}"
        opened.add_done_callback(failed)
        st.opened = opened
        return st

    # the first streams open before the clock starts (their lengths spread over one stream's);
    # slot k's sends at phase k % PHASES
    buckets = [[new_stream(stream_s * (k + 1) / n) for k in range(b, n, PHASES)] for b in range(PHASES)]
    last = streams[len(streams) - 1].opened if streams else None  # the engine opens them in order
    if last is not None:
        with contextlib.suppress(Exception):  # a failed open is that stream's error
            await asyncio.wrap_future(last)
    late = 0.0
    t0 = time.perf_counter()
    for i in itertools.count():
        due = t0 + i * tick
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
        now = time.perf_counter()
        late = max(late, now - due)
        b = i % PHASES
        over = i * tick >= level_s
        commands: list[StreamCommand] = []
        live: list[LiveStream] = []
        for st in buckets[b]:
            if over or len(st.pushes) >= st.pushes_total:  # it ends; until the level is over, another opens
                commands.append(End(st.session))
                st.ended = now
                if over:
                    continue
                st = new_stream(stream_s)
            start = (st.offset + len(st.pushes) * piece) % span
            commands.append(Audio(st.session, audio[start: start + piece]))
            st.pushes.append(now)
            live.append(st)
        buckets[b] = live
        engine.post_many(commands)
        if over and not any(buckets):
            break
    t_end = time.perf_counter()
    while (sink.finished() + sum(st.error is not None for st in streams.values()) < len(streams)
           and time.perf_counter() - t_end < drain_timeout_s):  # a stream that could not open never finishes
        await asyncio.sleep(0.02)
    return summarize(n, list(streams.values()), sink, metrics, t0, t_end, level_s, stream_s, send_s,
                     engine.recognizer.geometry.frame_seconds, limit_s, late, max_late_s)


def summarize(n: int, streams: list[LiveStream], sink: Deliveries, metrics: StepMetrics, t0: float, t_end: float,
              level_s: float, stream_s: float, send_s: float, frame_s: float, limit_s: float, late: float,
              max_late_s: float) -> dict[str, Any]:
    """One level's streams, latencies and steps, judged as load.py judges a daemon level."""
    by_id = {st.session.id: st for st in streams}
    for t, items in sink.log:
        for sid, frame in items:
            st = by_id[sid]
            if frame == FLUSHED:
                st.done = t
            elif frame == FAILED:
                st.error = sink.errors[sid]
            else:
                st.results.append((t, frame))
    latency: list[float] = []
    lags: list[float] = []
    drains: list[float] = []
    kept_up = 0
    for st in streams:
        lag = []
        for t, frame_end in st.results:
            pushed = bisect.bisect_right(st.pushes, t) * send_s
            processed = min(frame_end * frame_s, pushed)  # as a session reports it: never past the audio
            k = min(max(0, math.ceil(processed / send_s - 1e-6) - 1), len(st.pushes) - 1)
            if k >= 0:
                latency.append(t - st.pushes[k])
            lag.append(pushed - processed)
        lags += lag
        drain = None if st.done is None or st.ended is None else st.done - st.ended
        if drain is not None:
            drains.append(drain)
        if st.error is None and drain is not None and drain <= limit_s and (
                not lag or float(np.percentile(lag, 95)) <= limit_s):
            kept_up += 1
    steps = [(s, b) for t, s, b in metrics.steps if t0 <= t <= t_end]
    step_s = [s for s, _ in steps]
    errors = [st.error for st in streams if st.error]
    lat = percentiles(latency)
    client_bound = late > max_late_s
    passed = (not errors and kept_up == len(streams) and not client_bound
              and (lat["p95"] is None or lat["p95"] <= limit_s))
    return {"streams": n, "passed": passed, "opened": len(streams), "kept_up": kept_up, "errors": len(errors),
            "first_error": errors[0] if errors else None, "client_bound": client_bound,
            "stream_s": stream_s, "level_s": level_s, "wall_s": round(t_end - t0, 2),
            "opened_per_s": round((len(streams) - n) / max(t_end - t0, 1e-9), 1),
            "result_latency_s": lat, "lag_s": percentiles(lags), "drain_s": percentiles(drains),
            "send_late_max_s": round(late, 4),
            "steps": {"count": len(steps), "step_s": percentiles(step_s),
                      "mean_s": round(float(np.mean(step_s)), 4) if steps else None,
                      "mean_batch": round(float(np.mean([b for _, b in steps])), 1) if steps else None}}


def format_row(level: dict[str, Any]) -> str:
    lat, st = level["result_latency_s"], level["steps"]

    def f(x: float | None) -> str:
        return "   -  " if x is None else f"{x:6.3f}"
    batch = st["mean_batch"]
    return (f"{level['streams']:7d} {level['opened']:7d} {level['kept_up']:7d} {f(lat['p50'])} {f(lat['p95'])} "
            f"{f(level['lag_s']['p95'])} {f(level['drain_s']['max'])} {f(st['step_s']['p50'])} "
            f"{f(st['step_s']['p95'])} {'    -  ' if batch is None else f'{batch:7.1f}'} "
            f"{f(level['send_late_max_s'])}  {'ok' if level['passed'] else 'FAIL'}"
            f"{' (feeder late)' if level['client_bound'] else ''}"
            f"{' ' + level['first_error'] if level['first_error'] else ''}")


HEADER = ("streams  opened kept_up lat50  lat95  lag95  drainmx step50 step95   batch  late    result\n"
          "                        (result latency, lag, drain: s)  (engine steps: s, mean streams)")
