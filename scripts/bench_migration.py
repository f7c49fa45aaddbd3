#!/usr/bin/env python3
"""Live-migration benchmark of the production layout: a real `streamd serve --workers N` (its own
process, front ends included) serving real-time streams of a FastConformer-L sized model (random
weights that decode like a trained model's, `scripts/bench_model.py`; or `--model`), moved by the admin API every `--settle` seconds, e.g. bf16 -> fp16 ->
bf16. Streams send tone bursts, or loop `--audio` files (speech, for a trained model).

Reports per move: the engine pause, the re-capture of the target's CUDA graphs (before the pause,
while serving goes on) and the serving gap (last results before the pause -> first after it), all
from the admin report; the p95 and max result latency the clients measured from the admin call
to `--settle` seconds after it returned (the time from sending a piece of audio to receiving the
result that covers it), split into the preparation and the seconds after, beside the `--settle`
seconds before the first move (which begin `--warmup` seconds after every stream runs: the daemon's
first steps at each new batch size capture its graphs, a start-up backlog that is not the
migration's); whether the encoder and decoder run from graphs again, and which share of their calls
in the `--settle` seconds after the move ran eagerly (sizes the move did not prepare wait their turn
to be captured: `admin status`'s `calls`, `eager_calls`); and at the end the streams
dropped (the admin reports so far are written after every move, in case the run is stopped). A
move that gets no answer in `--move-timeout`, or during which the daemon says its engine stalled
(`/livez` 503, a minute after its last step), ends the moves with a dump of every daemon thread. For
moves that keep fp32 (e.g. cuda:0 -> cpu -> cuda:0), `--compare` runs the same streams through a
second daemon that is never moved and reports whether every stream's tokens are identical, and for
a stream whose are not, where they first differ and on which placement. The daemon admits by
`max_streams` (`--admission max_streams`): the benchmark sets the load itself, and admission by the
capacity estimate would refuse streams beyond what the start placement measured at warm-up (on a
CPU start, all of them). Prints a table, writes JSON.

    python scripts/bench_migration.py --streams 16 --chunk-ms 160 --workers 2 --start cpu/fp32 \
        --moves cpu/bf16,cpu/fp32 --settle 6
    python scripts/bench_migration.py --streams 1500 --chunk-ms 160 --workers 8 --start cuda:0/bf16 \
        --moves cuda:0/fp32,cuda:0/bf16,cuda:0/fp32,cuda:0/bf16
    python scripts/bench_migration.py --model streamd/assets/default-model.pt --streams 32 --start cuda:0/fp32 \
        --moves cpu/fp32,cuda:0/fp32 --audio tests/fixtures/real-speech/*.ogg
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import multiprocessing
import platform
import resource
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load  # noqa: E402 - scripts/load.py: the daemon process and the test audio

from bench_model import make_model  # noqa: E402 - scripts/bench_model.py: the benchmarks' random FastConformer-L
from streamd.admin_client import AdminError, request  # noqa: E402
from streamd.server.loop_watch import wake_ups  # noqa: E402

CHUNK_RC = {80: 0, 160: 1, 560: 6, 1120: 13}  # chunk ms -> right context
# Audio per stream added per move on a GPU, where the target's graphs are captured first (paced: up
# to ~100 s a move at 3000 streams). Streams stop when the last move is measured, except in a
# compared run (fp32 moves of a few streams), which is played to its end twice.
PREPARE_ALLOWANCE_S = 150.0
COMPARED_ALLOWANCE_S = 30.0

@dataclass(frozen=True)
class Feed:
    """What every client stream sends: `seconds` of audio, `send_s` of it a message; stream i
    loops `files[i % len(files)]` (audio files), or without files the tone bursts of seed i % 16
    (`load.tone_bursts`)."""

    seconds: float
    send_s: float
    files: tuple[str, ...] = ()

    def audio(self, index: int) -> tuple[load.Audio, bytes]:
        """Stream `index`'s audio and its PCM looped to `seconds`."""
        if self.files:
            return _looped_file(self.files[index % len(self.files)], self.seconds)
        return _looped_bursts(index % 16, self.seconds)


@functools.lru_cache(maxsize=None)
def _looped_bursts(seed: int, seconds: float) -> tuple[load.Audio, bytes]:
    """Made once a client process and shared by its streams of that seed (a copy a stream took
    10-20 MB each, tens of GB at 3000)."""
    audio = load.tone_bursts(seed=seed)
    return audio, load.looped(audio, seconds)


@functools.lru_cache(maxsize=None)
def _looped_file(path: str, seconds: float) -> tuple[load.Audio, bytes]:
    """As `_looped_bursts`, for an audio file."""
    audio = load.load_wav(Path(path))
    return audio, load.looped(audio, seconds)


async def client(url: str, index: int, feed: Feed, start_at: float, stop: asyncio.Event) -> dict[str, Any]:
    """One real-time stream of `feed`'s audio for stream `index` (two runs send the same audio)
    until it ends or `stop` is set: every result's latency (wall time received - when the message
    holding the audio it covers was sent) and the final tokens."""
    audio, pcm = feed.audio(index)
    send_s, seconds = feed.send_s, feed.seconds
    step = int(audio.rate * send_s) * 2
    log: dict[str, Any] = {"index": index, "results": [], "tokens": [], "finals": [], "t0": None,
                           "closed": None, "error": None}
    sent_at: list[float] = []
    await asyncio.sleep(max(0.0, start_at - time.time()))
    try:
        async with websockets.connect(url + "/v1/stream", max_size=None, open_timeout=60) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": audio.rate, "encoding": "s16le",
                                      "word_times": True}))

            async def read() -> None:
                async for m in ws:
                    d = json.loads(m)
                    if d["type"] in ("partial", "final"):
                        k = min(max(0, math.ceil(d["audio_processed"] / send_s - 1e-6) - 1), len(sent_at) - 1)
                        if k >= 0:
                            log["results"].append((time.time(), time.time() - sent_at[k]))
                        if d["type"] == "final":
                            log["tokens"].extend(d.get("tokens", []))
                            log["finals"].append((d["audio_processed"], len(log["tokens"])))
                    elif d["type"] == "summary":
                        log["summary"] = True
                    elif d["type"] == "error":
                        log["error"] = f"{d['code']}: {d['message']}"

            reader = asyncio.create_task(read())
            t0 = time.time()
            for k in range(round(seconds / send_s)):
                await asyncio.sleep(max(0.0, t0 + k * send_s - time.time()))
                await ws.send(pcm[k * step: (k + 1) * step])
                sent_at.append(time.time())
                log["t0"] = log["t0"] or sent_at[0]
                if reader.done() or stop.is_set():
                    break
            await ws.send(json.dumps({"type": "stop"}))
            await asyncio.wait_for(reader, 120)
        log["closed"] = ws.close_code
    except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as e:
        log["error"] = log["error"] or f"{type(e).__name__}: {e}"
    return log


def client_process(url: str, indices: list[int], feed: Feed, start_at: float, ramp_s: float,
                   stop_file: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Several streams in one process of their own (clients are elsewhere in production), started
    evenly over `ramp_s` (staggered phases, as real clients are); they stop early once `stop_file`
    exists. Returns the streams' logs and the process's own account: its CPU seconds and wall time,
    and how late its event loop woke from each 100-ms sleep (`loop_watch.wake_ups`: wall time, seconds late): a
    late loop reads results late, and the latencies measured here grow by as much."""
    async def all_clients() -> tuple[list[dict[str, Any]], list[tuple[float, float]]]:
        n = max(indices) + 1
        stop = asyncio.Event()
        lateness: list[tuple[float, float]] = []

        async def watch() -> None:
            while stop_file is not None and not Path(stop_file).exists():
                await asyncio.sleep(0.5)
            stop.set()

        watcher = asyncio.create_task(watch()) if stop_file is not None else None
        ticker = asyncio.create_task(wake_ups(lambda late: lateness.append((time.time(), late))))
        logs = await asyncio.gather(*(client(url, i, feed, start_at + ramp_s * i / n, stop) for i in indices))
        ticker.cancel()
        if watcher is not None:
            watcher.cancel()
        return list(logs), lateness
    wall0, cpu0 = time.time(), time.process_time()
    logs, lateness = asyncio.run(all_clients())
    return logs, {"cpu_s": time.process_time() - cpu0, "wall_s": time.time() - wall0, "lateness": lateness}


def p95_max(values: list[float]) -> dict[str, float | None]:
    """p95 and max of `values` in seconds (`load.percentiles`), rounded to ms (None: no value)."""
    q = load.percentiles(values)
    return {"p95_s": None if q["p95"] is None else round(q["p95"], 3),
            "max_s": None if q["max"] is None else round(q["max"], 3)}


def admin(sock: Path, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 120) -> dict[str, Any]:
    status, reply = request(method, path, body, socket_path=sock, timeout=timeout)
    return reply


def eager_share(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """Between two admin statuses: the engine's encoder and decoder calls (one each per step part)
    and the share of them that ran eagerly, and (`padded`, where the daemon counts them) that
    replayed a larger size's graph (None: a daemon without the counters, or no call)."""
    if "calls" not in before or "calls" not in after or after["calls"] <= before["calls"]:
        return None
    calls = after["calls"] - before["calls"]

    def share(key: str) -> dict[str, float]:
        return {part: (after[key][part] - before[key][part]) / calls for part in ("encoder", "decoder")}
    padded = {"padded": share("padded_calls")} if "padded_calls" in before and "padded_calls" in after else {}
    return {"calls": calls, **share("eager_calls"), **padded}


STARTED = time.monotonic()  # `--budget-s` counts from here
END_ALLOWANCE_S = 30.0  # after the last move: the clients stop and hand in their results, the daemon stops
LIVEZ_EVERY_S = 2.0  # how often a move's wait asks the daemon whether its engine stalled


def stalled(url: str) -> bool:
    """Whether the daemon at ws://`url` says its engine stalled (`/livez` 503)."""
    try:
        with urllib.request.urlopen(url.replace("ws", "http", 1) + "/livez", timeout=5):
            return False
    except urllib.error.HTTPError as e:
        return e.code == 503
    except OSError:  # no answer at all: the move's own timeout decides
        return False


def migrate(sock: Path, url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The admin migrate call; raises AdminError when no answer came in `timeout` seconds or the
    daemon said meanwhile that its engine stalled (its answer would never come)."""
    waiter = ThreadPoolExecutor(1)
    try:
        reply = waiter.submit(admin, sock, "POST", "/v1/migrate", body, timeout)
        end = time.monotonic() + timeout
        while True:
            try:
                return reply.result(timeout=LIVEZ_EVERY_S)
            except FutureTimeout:
                if stalled(url):
                    raise AdminError("the daemon says its engine stalled (/livez 503)") from None
                if time.monotonic() > end:
                    raise AdminError("timed out") from None
    finally:
        waiter.shutdown(wait=False)


def run_daemon(args: argparse.Namespace, model: Path, moves: list[str], tag: str, seconds: float,
               stop_early: bool) -> dict[str, Any]:
    """One daemon, `args.streams` streams of `seconds` of audio (ended once the last move is
    measured if `stop_early`), the moves every `args.settle` s once all streams run."""
    sock = Path(tempfile.mkdtemp()) / "admin.sock"
    device, dtype = args.start.split("/")
    daemon = load.Daemon(str(model), device, dtype, args.streams + 8,
                         ["--right-context", str(CHUNK_RC[args.chunk_ms]), "--workers", str(args.workers),
                          "--admission", "max_streams", "--batch-wait-ms", str(args.batch_wait_ms),
                          "--admin-socket", str(sock), *(["--thread-cpu", str(args.thread_cpu)]
                                                         if args.thread_cpu is not None else [])],
                         log_path=Path(args.out).with_suffix(f".{tag}.daemon.log"))
    restore = load.keep_off(daemon.thread_cpu)  # the client processes, started from here
    procs = max(1, min(args.client_procs, args.streams))
    pool = ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn"))
    reports: list[dict[str, Any]] = []
    try:
        url = daemon.wait_serving(timeout=900)
        ramp_s = min(2.0, args.settle / 2)
        start_at = time.time() + 3.0  # the client processes start (and import) first
        stop_file = str(sock.with_name("stop")) if stop_early else None
        feed = Feed(seconds, args.send_ms / 1000, tuple(args.audio))
        jobs = [pool.submit(client_process, url, list(range(p, args.streams, procs)), feed, start_at, ramp_s,
                            stop_file) for p in range(procs)]
        time.sleep(max(0.0, start_at + ramp_s - time.time()))
        deadline = time.time() + 120  # the client processes may start late (they import torch)
        while admin(sock, "GET", "/v1/status").get("streams", 0) < args.streams and time.time() < deadline:
            time.sleep(0.5)
        time.sleep(args.warmup)  # the start's captures and backlog
        baseline = (time.time(), time.time() + args.settle)  # every stream running, nothing moved yet
        spies = [load.py_spy(daemon.proc.pid, min(args.py_spy, args.settle), Path(args.out).with_suffix(f".{tag}.pyspy-before.txt"))]
        dumps = load.StackDumps(daemon.proc.pid, args.dump_every, Path(args.out).with_suffix(f".{tag}.stacks.txt"))
        time.sleep(args.settle)
        for i, move in enumerate(moves):
            dev, dt = move.split("/")
            if args.budget_s and reports and (time.monotonic() - STARTED + reports[-1]["until"] - reports[-1]["at"]
                                              + END_ALLOWANCE_S > args.budget_s):
                print(f"  [{tag}] moves {', '.join(moves[i:])} not made: the run's --budget-s {args.budget_s:.0f} "
                      "would not leave time to measure them", flush=True)
                break
            if i == 0:
                spies.append(load.py_spy(daemon.proc.pid, args.py_spy, Path(args.out).with_suffix(f".{tag}.pyspy-move1.txt")))
            t = time.time()
            try:
                reply = migrate(sock, url, {"device": dev, "dtype": dt}, args.move_timeout)
            except AdminError as e:  # the daemon did not answer: where every thread is, then no more moves
                dumps.now(f"move {move}: {e}")
                reports.append({"move": move, "at": t, "until": time.time(), "ok": False,
                                "error": f"no answer after {time.time() - t:.0f} s ({e})",
                                **dict.fromkeys(("prepare_ms", "pause_ms", "recapture_ms", "paced_ms", "behind_ms", "graphs",
                                                 "serving_gap_ms", "streams_live", "streams_failed", "encoder",
                                                 "decoder", "eager_after")), "eager_reason": ""})
                print(f"  [{tag}] {reports[-1]}", flush=True)
                Path(args.out).write_text(json.dumps({"partial": True, "tag": tag, "moves": reports}, indent=2))
                break
            report = reply.get("migration", {})
            done = time.time()  # the preparation (graphs captured while serving) took done - t of it
            answered = admin(sock, "GET", "/v1/status")
            time.sleep(max(0.0, done + args.settle - time.time()))
            status = admin(sock, "GET", "/v1/status")
            reports.append({"move": move, "at": t, "until": done + args.settle, "ok": reply.get("ok", False),
                            "error": report.get("error", ""), "prepare_ms": report.get("prepare_ms"),
                            "pause_ms": report.get("pause_ms"), "recapture_ms": report.get("recapture_ms"),
                            "paced_ms": report.get("paced_ms"), "behind_ms": report.get("behind_ms"),
                            "graphs": report.get("graphs"), "serving_gap_ms": report.get("serving_gap_ms"),
                            "streams_live": report.get("streams"), "streams_failed": report.get("streams_failed"),
                            "encoder": status.get("encoder"),
                            "decoder": status.get("decoder"), "eager_reason": status.get("eager_reason"),
                            "eager_after": eager_share(answered, status)})
            print(f"  [{tag}] {reports[-1]}", flush=True)
            # so far, in case the run is stopped before the clients' latencies are in (overwritten at the end)
            Path(args.out).write_text(json.dumps({"partial": True, "tag": tag, "moves": reports}, indent=2))
        dumps.stop()
        if stop_file is not None:
            Path(stop_file).touch()
        finished = [job.result() for job in jobs]
        logs = [log for stream_logs, _ in finished for log in stream_logs]
        processes = [account for _, account in finished]
        for spy in spies:
            if spy is not None:
                spy.wait()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # stopped early (SIGTERM): the clients end with the daemon
        restore()
        code = daemon.stop()
        if code not in (0, None):
            print(f"  daemon exit code {code}; last log lines:\n    " + "\n    ".join(daemon.log), flush=True)
    def latency(start: float, end: float) -> dict[str, float | None]:
        return p95_max([x for log in logs for t, x in log["results"] if start <= t < end])

    for r in reports:  # what clients saw from the admin call (preparation included) to `settle` s after it returned
        whole = latency(r["at"], r["until"])
        r["latency_p95_s"], r["latency_max_s"] = whole["p95_s"], whole["max_s"]
        r["latency_preparing"] = latency(r["at"], r["at"] + (r["prepare_ms"] or 0) / 1000)  # the target's graphs
        r["latency_after"] = latency(r["until"] - args.settle, r["until"])  # from the admin call's return

    def clients_late(start: float, end: float) -> dict[str, float | None]:
        return p95_max([x for account in processes for t, x in account["lateness"] if start <= t < end])

    dropped = [log["index"] for log in logs if log["closed"] != 1000 or not log.get("summary") or log["error"]]
    load_generator = {"processes": len(processes),
                      "max_process_cores": round(max(a["cpu_s"] / a["wall_s"] for a in processes), 2),
                      "cores_used": round(sum(a["cpu_s"] for a in processes) / max(a["wall_s"] for a in processes), 2),
                      "loop_late_before_moves": clients_late(*baseline),
                      "loop_late": clients_late(0.0, float("inf"))}
    return {"moves": reports, "latency_before_moves": latency(*baseline), "load_generator": load_generator,
            "streams_dropped": len(dropped), "dropped": dropped[:20],
            "errors": sorted({log["error"] for log in logs if log["error"]})[:5],
            "tokens": {log["index"]: log["tokens"] for log in logs},
            "timeline": {log["index"]: (log["t0"], log["finals"]) for log in logs}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = Path(args.model) if args.model else Path(tempfile.mkdtemp()) / "model.pt"
    if not args.model:
        make_model(model, args.vocab)
    moves = [m for m in args.moves.split(",") if m]
    compare = args.compare and all(m.endswith("/fp32") for m in [args.start, *moves])
    allowance = COMPARED_ALLOWANCE_S if compare else PREPARE_ALLOWANCE_S
    seconds = args.seconds or (args.settle * (len(moves) + 1) + min(2.0, args.settle / 2) + args.warmup
                               + (allowance * len(moves) if "cuda" in args.start + args.moves else 0))
    moved = run_daemon(args, model, moves, "moved", seconds, stop_early=not compare)  # compared: the same audio
    out: dict[str, Any] = {"machine": machine(), "streams": args.streams, "chunk_ms": args.chunk_ms,
                           "workers": args.workers, "start": args.start, "admission": "max_streams",
                           "moves": moved["moves"], "latency_before_moves": moved["latency_before_moves"],
                           "load_generator": moved["load_generator"],
                           "streams_dropped": moved["streams_dropped"],
                           "dropped": moved["dropped"], "errors": moved["errors"]}
    if compare:
        still = run_daemon(args, model, [], "unmoved", seconds, stop_early=False)
        same = [i for i, toks in moved["tokens"].items() if still["tokens"].get(i) == toks]
        out["tokens_identical_to_unmoved"] = f"{len(same)} of {len(moved['tokens'])}"
        cuts = [(r["until"] - args.settle, r["move"]) for r in moved["moves"] if r["ok"]]
        timeline: dict[int, tuple[float | None, list[tuple[float, int]]]] = moved["timeline"]
        out["tokens_differ"] = [first_difference(i, toks, still["tokens"].get(i, []), *timeline[i], args.start, cuts)
                                for i, toks in moved["tokens"].items() if i not in same]
        out["tokens_total"] = sum(len(t) for t in moved["tokens"].values())
        if args.control:  # what run-to-run variation alone gives (batches of other shapes, no move)
            again = run_daemon(args, model, [], "unmoved-again", seconds, stop_early=False)
            alike = [i for i, toks in still["tokens"].items() if again["tokens"].get(i) == toks]
            out["unmoved_runs_identical"] = f"{len(alike)} of {len(still['tokens'])}"
    return out


def first_difference(stream: int, moved: list[int], unmoved: list[int], t0: float | None,
                     finals: list[tuple[float, int]], start: str, cuts: list[tuple[float, str]]) -> dict[str, Any]:
    """Where a moved stream's tokens first leave the unmoved run's: the token's index, the audio
    second of the final that carried it, and the placement that served that audio (from when the
    stream sent it, `t0` + audio second, against the moves' cut-overs `cuts`: wall time, placement).
    A difference before the first cut-over is not the move's (e.g. batches of other shapes)."""
    k = next((i for i, (a, b) in enumerate(zip(moved, unmoved)) if a != b), min(len(moved), len(unmoved)))
    audio_s = next((a for a, n in finals if n > k), finals[-1][0] if finals else 0.0)
    wall = (t0 or 0.0) + audio_s
    served_on = start
    for at, placement in cuts:
        if wall >= at:
            served_on = placement
    return {"stream": stream, "token": k, "tokens": [len(moved), len(unmoved)], "audio_s": round(audio_s, 2),
            "served_on": served_on if cuts and wall >= cuts[0][0] else f"{start} (before the first move)"}


def machine() -> dict[str, Any]:
    return {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpus": [torch.cuda.get_device_name(d) for d in range(torch.cuda.device_count())]}


def fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.1f}" if isinstance(x, float) else str(x)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--chunk-ms", type=int, default=160, choices=sorted(CHUNK_RC))
    ap.add_argument("--workers", type=int, default=2, help="front-end processes of the daemon (`serve --workers`)")
    ap.add_argument("--start", default="cpu/fp32", help="DEVICE/DTYPE the daemon starts on")
    ap.add_argument("--moves", default="cpu/bf16,cpu/fp32", help="DEVICE/DTYPE of each move, in order")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds between moves (and measured after each)")
    ap.add_argument("--warmup", type=float, default=5.0,
                    help="seconds every stream runs before the measured window before the first move")
    ap.add_argument("--seconds", type=float, default=0.0,
                    help="audio per stream (default: enough for the moves; every stream must outlast them)")
    ap.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True,
                    help="when every placement is fp32: also run an unmoved daemon and compare tokens")
    ap.add_argument("--control", action="store_true",
                    help="with --compare: run the unmoved daemon twice and say how many streams' tokens the two "
                         "runs share (batches differ from run to run: what the moves are measured against)")
    ap.add_argument("--batch-wait-ms", type=int, default=2)
    ap.add_argument("--audio", nargs="*", default=[], metavar="FILE",
                    help="audio files (WAV, FLAC, OGG) stream i loops the i %% n-th of (default: tone bursts, which a "
                         "trained model may hear nothing in)")
    ap.add_argument("--send-ms", type=int, default=100,
                    help="audio per client message (default: 100); a result's latency counts from the send of the "
                         "message that held its last audio, so larger messages add to it")
    ap.add_argument("--model", default="", help="a streamd checkpoint (default: a random FastConformer-L)")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--client-procs", type=int, default=8, help="processes the client streams run in")
    ap.add_argument("--thread-cpu", type=int, default=None,
                    help="`serve --thread-cpu`: the daemon's engine thread alone on this CPU, the clients off it")
    ap.add_argument("--out", default="bench_migration.json")
    ap.add_argument("--dump-every", type=float, default=0.0,
                    help="seconds between py-spy stack dumps of the daemon's threads from the first move on, in "
                         "OUT.TAG.stacks.txt (and one when a move gets no answer; default: 0, off)")
    ap.add_argument("--move-timeout", type=float, default=300.0,
                    help="seconds a move's admin call may take; one that gets no answer ends the moves")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="seconds the whole run may take (0: no limit): no move starts that, at the last "
                         "move's length, would leave too little to stop and measure the clients (a run cut "
                         "by `timeout` reports no latencies)")
    ap.add_argument("--py-spy", type=float, default=0.0,
                    help="seconds of py-spy samples of the daemon (engine and front ends): before the first move "
                         "(at most --settle) and from its admin call on, beside --out (default: 0, off)")
    return ap.parse_args(argv)


def seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def eager_txt(share: dict[str, Any] | None) -> str:
    """`eager_share` as 'encoder %/decoder %' of the calls ('-': not measured)."""
    return "-" if share is None else f"{100 * share['encoder']:.0f}/{100 * share['decoder']:.0f} %"


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: the daemon is stopped on the way out
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # thousands of client sockets
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = run(args)
    base = result["latency_before_moves"]
    print(f"result latency before the first move: p95 {fmt(base['p95_s'])} s, max {fmt(base['max_s'])} s")
    gen = result["load_generator"]
    print(f"load generator: {gen['processes']} processes, {gen['cores_used']:.2f} cores in all, the busiest "
          f"{gen['max_process_cores']:.2f}; their event loops woke late before the first move by p95 "
          f"{fmt(gen['loop_late_before_moves']['p95_s'])} s, at most {fmt(gen['loop_late_before_moves']['max_s'])} s "
          f"(the whole run: {fmt(gen['loop_late']['max_s'])} s)")
    print(f"{'move':<16}{'ok':<4}{'pause ms':>10}{'capture ms':>11}{'prep s':>8}{'behind s':>9}{'gap ms':>9}"
          f"{'p95 s':>8}{'max s':>8}"
          f"{'prep p95/max':>14}{'after p95/max':>15}{'eager after':>12}  graphs now")
    for m in result["moves"]:
        prep, after = m["latency_preparing"], m["latency_after"]
        print(f"{m['move']:<16}{'y' if m['ok'] else 'n':<4}{fmt(m['pause_ms']):>10}{fmt(m['recapture_ms']):>11}"
              f"{fmt(seconds(m['prepare_ms'])):>8}{fmt(seconds(m.get('behind_ms'))):>9}{fmt(m['serving_gap_ms']):>9}{fmt(m['latency_p95_s']):>8}{fmt(m['latency_max_s']):>8}"
              f"{fmt(prep['p95_s']) + '/' + fmt(prep['max_s']):>14}{fmt(after['p95_s']) + '/' + fmt(after['max_s']):>15}"
              f"{eager_txt(m.get('eager_after')):>12}  "
              f"encoder {m['encoder']}, decoder {m['decoder']}{' (' + m['eager_reason'] + ')' if m['eager_reason'] else ''}")
    print(f"{result['streams']} streams at {result['chunk_ms']} ms, {result['workers']} front ends; dropped: "
          f"{result['streams_dropped']}{' ' + str(result['errors']) if result['errors'] else ''}"
          + (f"; tokens identical to the unmoved run: {result['tokens_identical_to_unmoved']}"
             if "tokens_identical_to_unmoved" in result else "")
          + (f"; two unmoved runs identical: {result['unmoved_runs_identical']}" if "unmoved_runs_identical" in result
             else ""))
    for d in result.get("tokens_differ", []):
        print(f"  stream {d['stream']}: first different token #{d['token']} (of {d['tokens'][0]} moved, "
              f"{d['tokens'][1]} unmoved), in the final at {d['audio_s']} s of its audio, served on {d['served_on']}")
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
