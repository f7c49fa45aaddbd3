#!/usr/bin/env python3
"""End-of-speech latency: how soon the final transcript arrives after the speaker stops, per
protocol face (native `/v1/stream`, OpenAI Realtime `/v1/realtime`, Deepgram `/v1/listen`).

Every stream sends speech then silence, over and over, in real time (`--send-ms` per message, on an
absolute schedule; the speech clip is trimmed of its leading and trailing quiet and padded to whole
messages, so the speaker stops exactly when a message is sent). The latency of an utterance is the
wall time from sending its last speech message to receiving its final:

* `finalize`: the client says "done" right after the last speech message, as Pipecat does when its
  local VAD sees the speaker stop: native `finalize`, Realtime `input_audio_buffer.commit`,
  Deepgram `Finalize`; server endpointing is off (native `endpointing: false`, Realtime
  `turn_detection: null`, Deepgram `endpointing=false`), so only the flush answers. The final:
  native `final` with reason `finalize`, Realtime `...transcription.completed`, Deepgram `Results`
  with `from_finalize: true`.
* `endpoint`: the server's endpointing only (its `silence_after_speech_ms`, which the latency
  includes; `--endpoint-ms` sets it for every face). The final: native `final` with reason
  `endpoint`, Realtime `completed` (server VAD), Deepgram `Results` with `speech_final: true`.
  An utterance that gets no such final before the next one ends is counted as missed (a random
  model may emit tokens in the silence and never endpoint).

Partials: Realtime always sends its deltas; native and Deepgram streams ask for none unless
`--interim` (Deepgram `interim_results=true`, with words, as Pipecat asks for them).

Levels: each face x mode x `--streams` value runs for `--seconds`, stream starts spread over
`--ramp-s` (random phases against the daemon's steps). Prints p50 / p95 / p99 per level and writes
JSON with the machine. Starts a daemon (`--model`, default: a random FastConformer-L as in
`bench_model.make_model`) or uses `--url`.

    python scripts/bench_eos_latency.py --model default --device cpu --streams 1 --chunk-ms 560
    python scripts/bench_eos_latency.py --device cuda --dtype bf16 --chunk-ms 160 --streams 1000 \\
        --client-procs 6 --workers 8 --daemon-args "--batch-wait-ms=2 --admission=max_streams"
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import load  # noqa: E402  (scripts/load.py: the daemon, machine info, percentiles)

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO / "tests" / "fixtures" / "nemo-tiny" / "in3_espeak_sentence.wav"
CHUNK_RC = {80: 0, 160: 1, 560: 6, 1120: 13}  # chunk ms -> right context
FACES = ("native", "realtime", "deepgram")
MODES = ("finalize", "endpoint")


def speech_clip(path: Path, send_ms: int) -> load.Audio:
    """The clip without its quiet ends, padded with silence at the front to whole messages."""
    audio = load.load_wav(path)
    x = np.frombuffer(audio.pcm, "<i2").astype(np.float32)
    win = audio.rate // 100
    loud = np.flatnonzero(np.abs(x[: x.size // win * win]).reshape(-1, win).max(1) > 0.02 * np.abs(x).max())
    x = x[loud[0] * win:(loud[-1] + 1) * win]
    per = audio.rate * send_ms // 1000
    x = np.concatenate([np.zeros(-x.size % per, np.float32), x])
    return load.Audio(audio.name, audio.rate, x.astype("<i2").tobytes())


# -- one stream per face ---------------------------------------------------------------------------

class Face:
    """Connects, sends audio and the end of an utterance, and tells its finals."""

    def __init__(self, face: str, mode: str, url: str, rate: int, endpoint_ms: int | None,
                 interim: bool = False) -> None:
        self.face, self.mode, self.url, self.rate, self.endpoint_ms = face, mode, url, rate, endpoint_ms
        self.interim = interim  # native and Deepgram: partials too (Realtime always sends its deltas)

    async def open(self) -> Any:
        finalize = self.mode == "finalize"
        if self.face == "native":
            ws = await websockets.connect(self.url + "/v1/stream", max_size=None)
            ep: Any = False if finalize else ({"silence_after_speech_ms": self.endpoint_ms} if self.endpoint_ms else True)
            await ws.send(json.dumps({"type": "start", "sample_rate": self.rate, "encoding": "s16le",
                                      "interim_results": self.interim, "endpointing": ep}))
            assert json.loads(await ws.recv())["type"] == "ready"
        elif self.face == "realtime":
            ws = await websockets.connect(self.url + "/v1/realtime?intent=transcription", max_size=None)
            assert json.loads(await ws.recv())["type"] == "session.created"
            turn = None if finalize else {"type": "server_vad", **({"silence_duration_ms": self.endpoint_ms}
                                                                   if self.endpoint_ms else {})}
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": self.rate}, "turn_detection": turn}}}}))
            assert json.loads(await ws.recv())["type"] == "session.updated"
        else:
            ep = "false" if finalize else (str(self.endpoint_ms) if self.endpoint_ms else "true")
            ws = await websockets.connect(f"{self.url}/v1/listen?encoding=linear16&sample_rate={self.rate}"
                                          f"&endpointing={ep}&interim_results={str(self.interim).lower()}",
                                          max_size=None)
        return ws

    def audio(self, pcm: bytes) -> str | bytes:
        if self.face == "realtime":
            return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        return pcm

    def end_of_speech(self) -> str:
        return json.dumps({"type": {"native": "finalize", "realtime": "input_audio_buffer.commit",
                                    "deepgram": "Finalize"}[self.face]})

    def close(self) -> str | None:
        return {"native": json.dumps({"type": "stop"}), "deepgram": json.dumps({"type": "CloseStream"})}.get(self.face)

    def is_final(self, m: dict[str, Any]) -> bool:
        """Whether a server message is the final this mode waits for."""
        kind = m.get("type")
        if self.face == "native":
            return kind == "final" and m["reason"] == self.mode
        if self.face == "realtime":
            return kind == "conversation.item.input_audio_transcription.completed"
        return kind == "Results" and bool(m["from_finalize"] if self.mode == "finalize" else m["speech_final"])


async def run_stream(face: Face, clip: load.Audio, silence_s: float, seconds: float, send_s: float,
                     start_at: float) -> dict[str, Any]:
    """One stream: speech, end of speech (finalize mode: the client's flush), silence, ... for
    `seconds`; returns the latencies of its utterances and how late the client sent."""
    per = int(clip.rate * send_s) * 2
    speech = [clip.pcm[i:i + per] for i in range(0, len(clip.pcm), per)]
    gap = [bytes(per)] * max(1, round(silence_s / send_s))
    out: dict[str, Any] = {"latency": [], "missed": 0, "late_max": 0.0, "error": None}
    finals: list[float] = []
    eos: list[float] = []
    try:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        ws = await face.open()

        async def read() -> None:
            try:
                async for text in ws:
                    if face.is_final(json.loads(text)):
                        finals.append(time.perf_counter())
            except websockets.ConnectionClosed:
                pass

        reader = asyncio.create_task(read())
        t0, k = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            for i, piece in enumerate(speech + gap):
                k += 1
                delay = t0 + k * send_s - time.perf_counter()  # the message's audio has been "captured"
                if delay > 0:
                    await asyncio.sleep(delay)
                out["late_max"] = max(out["late_max"], -delay)
                await ws.send(face.audio(piece))
                if i == len(speech) - 1:
                    eos.append(time.perf_counter())
                    if face.mode == "finalize":
                        await ws.send(face.end_of_speech())
        await asyncio.sleep(2.0)  # the last utterance's final
        if (close := face.close()) is not None:
            await ws.send(close)
        await ws.close()
        await asyncio.wait_for(reader, 10)
    except Exception as e:  # a level reports its failed streams
        out["error"] = f"{type(e).__name__}: {e}"
    for j, t in enumerate(eos):
        until = eos[j + 1] if j + 1 < len(eos) else float("inf")
        answer = next((f for f in finals if t < f < until), None)
        if answer is None:
            out["missed"] += 1
        else:
            out["latency"].append(answer - t)
    return out


async def run_streams(spec: dict[str, Any], n: int, offsets: list[float]) -> list[dict[str, Any]]:
    face = Face(spec["face"], spec["mode"], spec["url"], spec["clip"].rate, spec["endpoint_ms"], spec["interim"])

    async def bounded(offset: float) -> dict[str, Any]:  # a stalled stream is reported, not waited for
        limit = spec["start_at"] + offset - time.time() + spec["seconds"] + 60
        try:
            return await asyncio.wait_for(run_stream(face, spec["clip"], spec["silence_s"], spec["seconds"],
                                                     spec["send_s"], spec["start_at"] + offset), limit)
        except TimeoutError:
            return {"latency": [], "missed": 0, "late_max": 0.0, "error": "stalled: no end within 60 s"}

    return await asyncio.gather(*(bounded(o) for o in offsets[:n]))


def _worker(spec: dict[str, Any], offsets: list[float]) -> list[dict[str, Any]]:
    return asyncio.run(run_streams(spec, len(offsets), offsets))


def run_level(url: str, face: str, mode: str, n: int, clip: load.Audio, args: argparse.Namespace,
              pool: ProcessPoolExecutor | None) -> dict[str, Any]:
    load.wait_idle(url)
    before = time.monotonic()
    offsets = list(np.random.default_rng(n).uniform(0, args.ramp_s if n > 1 else 0, n))
    spec = {"face": face, "mode": mode, "url": url, "clip": clip, "silence_s": args.silence_s,
            "seconds": args.seconds, "send_s": args.send_ms / 1000, "start_at": time.time() + 1.0,
            "endpoint_ms": args.endpoint_ms, "interim": args.interim}
    if pool is None or n < args.client_procs:
        streams = asyncio.run(run_streams(spec, n, offsets))
    else:
        futures = [pool.submit(_worker, spec, offsets[p::args.client_procs]) for p in range(args.client_procs)]
        streams = [s for f in futures for s in f.result()]
    latency = [x for s in streams for x in s["latency"]]
    errors = [s["error"] for s in streams if s["error"]]
    pct = load.percentiles(latency)
    return {"face": face, "mode": mode, "streams": n, "latency_s": pct,
            "missed": sum(s["missed"] for s in streams), "errors": len(errors), "first_error": errors[:1],
            "client_late_max_s": max((s["late_max"] for s in streams), default=0.0),
            "wall_s": round(time.monotonic() - before, 1)}


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.0f}"


def print_level(lv: dict[str, Any]) -> None:
    p = lv["latency_s"]
    print(f"{lv['face']:>9} {lv['mode']:>9} {lv['streams']:>6} {p['n']:>6} {fmt_ms(p['p50']):>6} "
          f"{fmt_ms(p['p95']):>6} {fmt_ms(p['p99']):>6} {fmt_ms(p['max']):>6} {lv['missed']:>6} {lv['errors']:>6} "
          f"{1000 * lv['client_late_max_s']:>8.0f}", flush=True)


def build_model(args: argparse.Namespace) -> str:
    if args.model == "default":
        from streamd.model.checkpoint import resolve_model_path

        return str(resolve_model_path(None))
    if args.model:
        return str(args.model)
    from bench_model import random_model_file

    return str(random_model_file())


def raise_fd_limit() -> None:
    """Thousands of sockets: the daemon and the client processes inherit the raised limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running daemon (default: start one)")
    p.add_argument("--model", help="model file, or 'default' (default: a random FastConformer-L)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--chunk-ms", type=int, choices=sorted(CHUNK_RC), help="chunk (default: the model's)")
    p.add_argument("--workers", type=int, default=0, help="the daemon's front-end processes")
    p.add_argument("--daemon-args", default="", help="more `streamd serve` flags")
    p.add_argument("--streams", default="1", help="comma-separated stream counts (default: 1)")
    p.add_argument("--faces", default=",".join(FACES))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--seconds", type=float, default=20.0, help="audio per stream and level (default: 20)")
    p.add_argument("--ramp-s", type=float, default=3.0, help="stream starts spread over this long")
    p.add_argument("--silence-s", type=float, default=1.6, help="silence after each utterance (default: 1.6)")
    p.add_argument("--endpoint-ms", type=int, default=None, help="endpoint silence for every face (default: the "
                   "server's)")
    p.add_argument("--interim", action="store_true", help="native and Deepgram streams ask for partials too "
                   "(interim results, as Pipecat's Deepgram client does; Realtime always sends them)")
    p.add_argument("--send-ms", type=int, default=20, help="audio per client message (default: 20, as Pipecat)")
    p.add_argument("--speech", type=Path, default=SPEECH, help="speech WAV (default: the espeak test fixture)")
    p.add_argument("--client-procs", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("eos-latency.json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_fd_limit()
    counts = [int(n) for n in args.streams.split(",")]
    clip = speech_clip(args.speech, args.send_ms)
    daemon = None
    if args.url is None:
        model = build_model(args)
        extra = ["--workers", str(args.workers), *args.daemon_args.split()]
        if args.chunk_ms is not None:
            extra += ["--right-context", str(CHUNK_RC[args.chunk_ms])]
        daemon = load.Daemon(model, args.device, args.dtype, max(counts) + 64, extra,
                             log_path=args.out.with_suffix(".daemon.log"))
    pool = (ProcessPoolExecutor(args.client_procs, mp_context=get_context("spawn"))
            if args.client_procs > 1 else None)
    levels: list[dict[str, Any]] = []

    def save() -> None:  # after every level: a run cut short by a timeout keeps what it measured
        args.out.write_text(json.dumps({"machine": load.machine_info(),
                                        "args": {k: str(v) for k, v in vars(args).items()},
                                        "levels": levels}, indent=1))
    try:
        url = args.url or daemon.wait_serving()  # type: ignore[union-attr]
        print(f"daemon {url}; speech {clip.name} {clip.seconds:.2f} s + {args.silence_s:g} s silence, "
              f"{args.send_ms} ms messages", flush=True)
        print(f"{'face':>9} {'mode':>9} {'streams':>6} {'n':>6} {'p50':>6} {'p95':>6} {'p99':>6} {'max':>6} "
              f"{'missed':>6} {'errors':>6} {'late_ms':>8}   (latencies in ms)", flush=True)
        for n in counts:
            for face in args.faces.split(","):
                for mode in args.modes.split(","):
                    level = run_level(url, face, mode, n, clip, args, pool)
                    levels.append(level)
                    print_level(level)
                    save()
    finally:
        if pool is not None:
            pool.shutdown()
        if daemon is not None:
            daemon.stop()
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
