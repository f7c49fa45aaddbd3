#!/usr/bin/env python3
"""The host's share of an engine step, per stream: N streams with a chunk ready each step, the
model's work replaced by no-ops (log-mel frames are zeros, the encoder returns zeros, the
decoder emits nothing), so what is timed is the per-stream Python and numpy work that runs on
the engine thread: queuing audio, the batch's sample rows, window layout, results. On a GPU
this work is what the daemon's engine thread spends on launching steps (issue 13). On a CPU the
step's few batched torch calls (pre-emphasis; window assembly: `cat`, `gather`) also run on the
host, on fresh (unpinned) buffers, and are counted: `--profile` separates them from the
per-stream work, and `--queued-only` replaces them by no-ops too and copies the samples from
the streams' rings as a GPU does (what is left is the engine thread's share of a step on a GPU,
where the batched work is only queued).

It prints the median step and, per stream, each phase's median: audio in (the pieces pushed, or
the front ends' messages read and taken), readiness, launch and landing (results delivered).

`--front-ends N` adds the daemon's channel work on the engine thread: N front-end processes
(forked; their own work is not timed) each send their streams' pieces as the daemon's do (a
`SharedAudio` naming the samples they put in their `AudioPipe`; with `--channel socket` a
`StreamAudio` carrying them, the way the pipe replaced), which the engine thread reads from the
channel's socket and takes (`frontends.take_audio`, as `Bridge` does):
"audio in" counts the time in those calls, not the waits for the front ends. Each step's
results leave as one framed `Results` per front end.

    python scripts/bench_host_step.py --streams 2000 --chunk-ms 160 --piece-ms 100
    python scripts/bench_host_step.py --streams 2000 --chunk-ms 1120 --piece-ms 100 --profile
    python scripts/bench_host_step.py --streams 3000 --chunk-ms 160 --piece-ms 160 --front-ends 8
    python scripts/bench_host_step.py --streams 3000 --chunk-ms 160 --piece-ms 160 --front-ends 8 --queued-only
    python scripts/bench_host_step.py --streams 3000 --chunk-ms 160 --piece-ms 160 --front-ends 8 --queued-only --channel socket
"""
from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import pstats
import selectors
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from streamd.decoding.greedy import BatchedHyps  # noqa: E402
from streamd.engine.engine import Engine  # noqa: E402
from streamd.engine.recognizer import Recognizer  # noqa: E402
from streamd.engine.types import EngineSession  # noqa: E402
from streamd.model.checkpoint import load_model  # noqa: E402
from streamd.server.audio_pipe import AudioPipe  # noqa: E402
from streamd.server.channel import BlockingEnd, NonBlockingEnd, _frame, socket_pair  # noqa: E402
from streamd.server.frontends import front_messages, take_audio  # noqa: E402
from streamd.server.link import SharedAudio, StreamAudio  # noqa: E402

CHUNK_RC = {80: 0, 160: 1, 560: 6, 1120: 13}
DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "streamd" / "assets" / "default-model.pt"


class _NoFrames:
    """A log-mel module whose frames are zeros of the right shape (no STFT)."""

    def __init__(self, logmel: Any) -> None:
        self.dims, self.featurizer = logmel.dims, logmel.featurizer

    def frames(self, padded: torch.Tensor) -> torch.Tensor:
        return torch.zeros(padded.shape[0], self.dims.n_mels, (padded.shape[1] - self.dims.n_fft) // self.dims.hop_length + 1)


class _NoEncoder:
    """An encoder step that returns zeros of the right shape (and says it ran eagerly)."""

    mode, eager_reason, padded = "eager", "replaced by a no-op", False

    def __init__(self, frames: int, d_model: int) -> None:
        self.frames, self.d_model = frames, d_model

    def __call__(self, cache: Any, rows: torch.Tensor, mel: torch.Tensor, lengths: Any, start: Any, full: Any,
                 att_context: Any) -> tuple[torch.Tensor, torch.Tensor]:
        b = int(rows.shape[0])
        return torch.zeros(b, self.frames, self.d_model), torch.full((b,), self.frames)


class _NoSearch:
    """A decoder that emits nothing and keeps the carry (the real one's after-start state)."""

    def __init__(self, search: Any) -> None:
        self.initial_state = search.initial_state

    def __call__(self, enc: torch.Tensor, lengths: torch.Tensor, state: Any) -> tuple[BatchedHyps, Any]:
        b = int(enc.shape[0])
        empty = torch.zeros(b, 0, dtype=torch.long)
        return BatchedHyps(empty, empty, torch.zeros(b, dtype=torch.long)), state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--chunk-ms", type=int, default=160, choices=sorted(CHUNK_RC))
    ap.add_argument("--piece-ms", type=int, default=100, help="audio per pushed piece (a client message)")
    ap.add_argument("--front-ends", type=int, default=0,
                    help="route audio and results through N front ends' channel messages (0: direct)")
    ap.add_argument("--channel", choices=("pipe", "socket"), default="pipe",
                    help="with --front-ends: the samples in shared memory (the daemon's way) or in the messages")
    ap.add_argument("--queued-only", action="store_true",
                    help="also replace the step's batched torch work (pre-emphasis, frames, windows) by no-ops: "
                         "on a GPU it is queued, not computed, so what is left is the engine thread's share there")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--profile", action="store_true", help="also print cProfile's top functions")
    args = ap.parse_args()
    torch.set_num_threads(1)
    m = load_model(args.model).model.eval()
    right = CHUNK_RC[args.chunk_ms]
    # --queued-only: as on a GPU, whose steps copy the samples straight from the streams' rings
    rec = Recognizer(m, capacity=args.streams, att_context=(m.dims.att_context(None)[0], right),
                     ring_copy=True if args.queued_only else None)
    rec.encoder_step = _NoEncoder(right + 1, m.dims.d_model)  # type: ignore[assignment]
    rec.search = _NoSearch(rec.search)  # type: ignore[assignment]
    no_frames = _NoFrames(rec._logmel)
    rec._feature_maker = lambda device: no_frames  # type: ignore[assignment, method-assign, return-value]
    if args.queued_only:
        n_mels, w = rec.mel_window
        rec._frames = lambda samples, real_host, real, device: torch.empty(  # type: ignore[method-assign]
            samples.shape[0], n_mels, 0)
        rec._windows = lambda frames, rows, index: torch.empty(frames.shape[0], n_mels, w)  # type: ignore[method-assign]
        rec._ring_segments = lambda lo, hi, rows, at, size, device: torch.empty(  # type: ignore[method-assign]
            rows.shape[0], size)
    # The engine's own bookkeeping too (readiness, launch, landing, delivery to each front end's
    # sink: its framed messages, as `Bridge` sends them), called here on this thread as its thread
    # would: no other thread runs.
    engine = Engine(rec, max_batch=args.streams, batch_wait_s=0.0, pipeline=False)
    sinks = [lambda items: _frame(front_messages(items)) for _ in range(max(1, args.front_ends))]
    sessions = [EngineSession(id=i, sink=sinks[i % len(sinks)]) for i in range(args.streams)]
    for session in sessions:
        engine._open(session)
        engine.take_audio(session, np.zeros(3000, np.float32))
    rate = m.dims.features.sample_rate
    chunk, piece = rate * args.chunk_ms // 1000, rate * args.piece_ms // 1000
    audio = (np.random.default_rng(0).standard_normal(chunk * 12) * 0.1).astype(np.float32)
    fronts = [Front(list(range(f, args.streams, args.front_ends)), args.channel == "pipe", audio, chunk, piece)
              for f in range(args.front_ends)]
    selector = selectors.DefaultSelector()
    for f in fronts:
        selector.register(f.channel, selectors.EVENT_READ, f)

    def front_end_audio(k: int) -> float:
        """Step k's audio from every front end, as `Bridge` takes it; returns the seconds spent
        in the engine thread's calls (reading the channels, taking the pieces)."""
        busy, due = 0.0, len(fronts) * -(-chunk // piece)
        for f in fronts:
            f.channel.send(k)  # the front end sends its messages of step k
        while due:
            for key, _ in selector.select():
                f = key.data
                t = time.perf_counter()
                messages, _ = f.channel.read()
                for batch in messages:
                    for m in batch:
                        take_audio(engine, m, [sessions[i] for i in m.stream_ids], f.pipe)
                    due -= 1
                busy += time.perf_counter() - t
        return busy

    def step(k: int) -> float:
        t0 = time.perf_counter()
        if fronts:
            audio_in = front_end_audio(k)
            t0 = time.perf_counter() - audio_in
        else:
            base = (k % 10) * chunk
            for session in sessions:
                for j in range(0, chunk, piece):
                    engine.take_audio(session, audio[base + j: base + min(j + piece, chunk)])
        t1 = time.perf_counter()
        if engine._count_ready() != args.streams:
            raise RuntimeError("a stream had no full chunk")
        t2 = time.perf_counter()
        engine._launch()
        t3 = time.perf_counter()
        engine._land()
        t4 = time.perf_counter()
        phases.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
        return t4 - t0

    phases: list[tuple[float, float, float, float]] = []  # audio in, readiness, launch, landing
    # warm-up: 3 steps, and with front ends until their pipes have gone round once (a page of
    # shared memory costs a fault in each process the first time it is touched)
    warm = 3 if not fronts else max(3, -(-fronts[0].pipe.capacity // (4 * chunk * len(fronts[0].ids))) + 1)
    for k in range(warm):
        step(k)
    phases.clear()
    times = [step(k) for k in range(warm, warm + args.steps)]
    ms = 1000 * float(np.median(times))
    via = f", from {args.front_ends} front-end processes ({args.channel})" if fronts else ""
    via += ", batched torch work replaced by no-ops" if args.queued_only else ""
    print(f"{args.streams} streams, {args.chunk_ms} ms chunks, {args.piece_ms} ms pieces{via}: host step {ms:.1f} ms "
          f"median of {args.steps}, {1000 * ms / args.streams:.1f} us a stream")
    share = np.median(np.array(phases), axis=0) * 1e6 / args.streams
    print("us a stream, median: audio in {:.2f}, readiness {:.2f}, launch {:.2f}, landing {:.2f}".format(*share))
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for k in range(3):
            step(k)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    for f in fronts:
        f.stop()


class Front:
    """A forked front-end process sending its streams' pieces of each step it is asked for,
    as `RemoteEngine._flush` does (one message a piece's time, every stream of it in it)."""

    def __init__(self, ids: list[int], shared: bool, audio: np.ndarray, chunk: int, piece: int) -> None:
        ours, theirs = socket_pair()
        self.ids, self.channel, self.pipe = ids, NonBlockingEnd(ours), AudioPipe.create()
        self.process = multiprocessing.get_context("fork").Process(
            target=self._serve, args=(BlockingEnd(theirs), ids, shared, audio, chunk, piece), daemon=True)
        self.process.start()
        theirs.close()

    def _serve(self, channel: BlockingEnd, ids: list[int], shared: bool, audio: np.ndarray, chunk: int,
               piece: int) -> None:
        while (k := channel.recv()) is not None:
            base = (k % 10) * chunk
            for j in range(0, chunk, piece):
                a = audio[base + j: base + min(j + piece, chunk)]
                pieces = [a] * len(ids)
                put = self.pipe.put(pieces) if shared else None
                sizes = [a.size] * len(ids)
                channel.send([StreamAudio(ids, sizes, np.concatenate(pieces)) if put is None
                              else SharedAudio(ids, sizes, *put)])

    def stop(self) -> None:
        self.channel.send(None)
        while self.channel.wants_write:
            self.channel.flush()
        self.process.join(5)


if __name__ == "__main__":
    main()
