#!/usr/bin/env python3
"""Long protocol fuzz run: random and mutated client sessions (tests/protocol_fuzz.py) against a
daemon until `--messages` frames were sent, with a control stream beside them.

Starts a daemon (`python -m streamd serve`, tiny fixture model, CPU, a free port, short idle
timeout, 64 KiB messages) or uses `--url` (give `--idle-timeout` and `--max-bytes` to match it).
Session i is made from the seed (`--seed`, i) alone, so `--replay i` runs that one session again
and prints what happened. Counts and writes (`--json`): messages and sessions, problems by kind
with examples (a session that ended otherwise than docs/protocol.md says, a hung connection), the
daemon's crashes (exit, ERROR log lines, tracebacks), its RSS over the run, its streams_active at
the end, and control runs whose transcript changed. Exit status 1 on any problem.

    nice python scripts/fuzz_protocol.py --messages 100000 --json fuzz.json
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from protocol_fuzz import Outcome, documented_errors, problems, run, session  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "nemo-tiny"
SERVING = re.compile(r"serving .* on (wss?)://([^:/\s]+):(\d+)/v1/stream")
VOLATILE = ("seq", "audio_processed")


def start_daemon(model: Path, idle_s: float, max_bytes: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    cmd = [sys.executable, "-m", "streamd", "serve", "--model", str(model), "--device", "cpu", "--port", "0",
           "--max-streams", "256", "--idle-timeout-s", str(idle_s), "--max-message-bytes", str(max_bytes),
           "--admin-socket", "", "--config", ""]
    fh = log.open("wb")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if m := SERVING.search(log.read_text(errors="replace")):
            return proc, f"ws://{m.group(2)}:{m.group(3)}"
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the daemon did not start:\n{log.read_text(errors='replace')[-3000:]}")


def rss_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def streams_active(url: str, settle_s: float = 30.0) -> float | None:
    """The daemon's streams_active gauge once it is 0, or after `settle_s` (a client that closed
    while the daemon was busy can hold its stream for websockets' 10 s close timeout)."""
    deadline, value = time.monotonic() + settle_s, None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url.replace("ws", "http", 1) + "/metrics", timeout=10) as r:
                text = r.read().decode()
        except OSError:
            return None
        m = re.search(r"^streamd_streams_active (\S+)$", text, re.M)
        value = float(m.group(1)) if m else None
        if value == 0:
            break
        time.sleep(0.5)
    return value


def results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k not in VOLATILE} for m in messages if m["type"] in ("partial", "final")]


async def stream(url: str, pcm: bytes, rng: np.random.Generator) -> Outcome:
    """One clean control session of `pcm` in random pieces."""
    import websockets

    out = Outcome()
    async with websockets.connect(url + "/v1/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le", "word_times": True}))
        i = 0
        while i < len(pcm):
            k = int(rng.integers(1, 6400))
            await ws.send(pcm[i: i + k])
            i += k
            await asyncio.sleep(0.01)
        await ws.send(json.dumps({"type": "stop"}))
        async for m in ws:
            out.messages.append(json.loads(m))
    out.close_code = ws.close_code
    return out


async def control(url: str, pcm: bytes, done: asyncio.Event, stats: dict[str, Any]) -> None:
    want = results((await stream(url, pcm, np.random.default_rng(0))).messages)
    while not done.is_set():
        got = await stream(url, pcm, np.random.default_rng(stats["control_runs"] + 1))
        stats["control_runs"] += 1
        if got.close_code != 1000 or results(got.messages) != want:
            stats["control_changed"] += 1


async def fuzz(args: argparse.Namespace, url: str, stats: dict[str, Any], pid: int | None) -> None:
    errors = documented_errors()
    pcm = sf.read(str(FIXTURES / "in3_espeak_sentence.wav"), dtype="int16")[0].tobytes()
    done = asyncio.Event()
    beside = asyncio.create_task(control(url, pcm, done, stats))
    kinds: collections.Counter[str] = collections.Counter()
    next_index, t0, last_report = 0, time.monotonic(), 0.0

    async def worker() -> None:
        nonlocal next_index, last_report
        while stats["messages"] < args.messages:
            i, next_index = next_index, next_index + 1
            s = session(np.random.default_rng([args.seed, i]), args.max_bytes)
            out = await run(url, s, args.idle_timeout + args.hang_s)
            stats["sessions"] += 1
            stats["messages"] += out.sent
            stats["endings"][out.ending] += 1
            stats["hangs"] += out.hung
            for p in problems(s, out, errors):
                kind = re.sub(r"\d+", "N", p)[:80]
                kinds[kind] += 1
                if kinds[kind] <= 3:
                    stats["examples"].append({"session": i, "label": s.label, "problem": p[:500]})
            if time.monotonic() - last_report > 30:
                last_report = time.monotonic()
                if pid is not None:
                    stats["rss_mb"].append((round(last_report - t0), rss_mb(pid)))
                print(f"{stats['messages']} messages, {stats['sessions']} sessions, "
                      f"{sum(kinds.values())} problems, {stats['hangs']} hangs", flush=True)

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    done.set()
    await beside
    stats["problems"] = dict(kinds)
    stats["seconds"] = round(time.monotonic() - t0, 1)


async def replay(args: argparse.Namespace, url: str) -> None:
    s = session(np.random.default_rng([args.seed, args.replay]), args.max_bytes)
    out = await run(url, s, args.idle_timeout + args.hang_s)
    print(json.dumps({"label": s.label, "expect": sorted(s.expect), "ending": out.ending,
                      "close": [out.close_code, out.close_reason[:200]], "messages": out.messages[-5:],
                      "problems": problems(s, out, documented_errors()),
                      "actions": [repr(a)[:200] for a in s.actions[:3] + s.actions[-3:]]}, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000, help="frames to send in all (default: %(default)s)")
    ap.add_argument("--concurrency", type=int, default=16, help="sessions at once (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--url", help="fuzz this daemon (ws://HOST:PORT) instead of starting one")
    ap.add_argument("--model", type=Path, default=FIXTURES / "tiny_streaming_fastconformer_rnnt.nemo")
    ap.add_argument("--idle-timeout", type=float, default=2.0, help="the daemon's idle_timeout_s")
    ap.add_argument("--max-bytes", type=int, default=64 * 1024, help="the daemon's max_message_bytes")
    ap.add_argument("--hang-s", type=float, default=15.0, help="a close later than idle timeout + this is a hang")
    ap.add_argument("--replay", type=int, help="run session REPLAY alone and print it")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    proc, log = None, Path(tempfile.mkdtemp(prefix="streamd-fuzz-")) / "daemon.log"
    url = args.url
    if url is None:
        proc, url = start_daemon(args.model, args.idle_timeout, args.max_bytes, log)
    if args.replay is not None:
        try:
            asyncio.run(replay(args, url))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(60)
        return 0
    stats: dict[str, Any] = {"seed": args.seed, "messages": 0, "sessions": 0, "hangs": 0, "control_runs": 0,
                             "control_changed": 0, "endings": collections.Counter(), "examples": [],
                             "rss_mb": []}
    pid = proc.pid if proc is not None else None
    try:
        asyncio.run(fuzz(args, url, stats, pid))
        stats["streams_active_after"] = streams_active(url)
        if pid is not None:
            stats["rss_mb"].append((stats["seconds"], rss_mb(pid)))
    finally:
        if proc is not None:
            stats["daemon_alive_at_end"] = proc.poll() is None
            proc.terminate()
            stats["daemon_exit"] = proc.wait(60)
            text = log.read_text(errors="replace")
            stats["daemon_errors"] = [line[:300] for line in text.splitlines()
                                      if " ERROR " in line or line.startswith("Traceback")][:20]
    crashes = len(stats.get("daemon_errors", [])) + (not stats.get("daemon_alive_at_end", True))
    stats["crashes"] = crashes
    stats["endings"] = dict(stats["endings"])
    print(json.dumps({k: v for k, v in stats.items() if k != "examples"}, indent=1))
    for e in stats["examples"][:10]:
        print("example:", json.dumps(e)[:400])
    if args.json:
        args.json.write_text(json.dumps(stats, indent=1) + "\n")
    ok = not stats["problems"] and not crashes and not stats["control_changed"] and stats["control_runs"] \
        and stats.get("streams_active_after") == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
