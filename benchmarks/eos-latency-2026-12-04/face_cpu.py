#!/usr/bin/env python3
"""A front end's CPU per protocol face, in one process, without sockets or an engine: a face's
connection takes the bench's 40 ms audio messages and the engine results one stream gets at 160 ms
steps, replaying `bench_eos_latency.py`'s audio (speech, then 1.6 s of silence, a `finalize` at the
end of the speech) and the labels the random FastConformer-L emits on it (`fcl-random-labels.json`).
Prints the CPU time (`time.process_time`, little moved by other processes) per audio message and per
result; run from the tree to measure:

    cd /work/main && python benchmarks/eos-latency-2026-12-04/face_cpu.py
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import sentencepiece as spm

sys.path.insert(0, "scripts")
import bench_eos_latency as bench  # noqa: E402
from streamd.config import Config  # noqa: E402
from streamd.engine.engine import EngineSession  # noqa: E402
from streamd.engine.recognizer import ChunkResult  # noqa: E402
from streamd.engine.stream import ChunkGeometry  # noqa: E402
from streamd.model.tokenizer import Tokenizer  # noqa: E402
from streamd.server.deepgram import ListenStream  # noqa: E402
from streamd.server.handler import Connection, StreamContext  # noqa: E402
from streamd.server.metrics import Metrics  # noqa: E402
from streamd.server.native import NativeStream  # noqa: E402
from streamd.server.realtime import RealtimeStream  # noqa: E402

HERE = Path(__file__).resolve().parent
FACES = ("native", "deepgram", "realtime", "native+interim", "deepgram+interim")
FRAME_S, STEP_FRAMES, MESSAGE = 0.08, 2, 1280  # 160 ms steps of 80 ms frames; 40 ms of 16 kHz s16le


def random_tokenizer() -> Tokenizer:
    """The random FastConformer-L's tokenizer (as `bench_migration.make_model` trains it, seed 0)."""
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(2, 9))) for _ in range(4000)]
    proto = tempfile.NamedTemporaryFile(suffix=".model", delete=False).name[:-6]
    spm.SentencePieceTrainer.train(sentence_iterator=(" ".join(rng.choice(words, 12)) for _ in range(20000)),
                                   model_prefix=proto, vocab_size=1024, model_type="bpe", minloglevel=2)
    return Tokenizer(Path(proto + ".model").read_bytes())


class Socket:
    def __init__(self, path: str) -> None:
        self.request = SimpleNamespace(path=path, headers={})
        self.remote_address, self.sent = None, 0

    async def send(self, text: str) -> None:
        self.sent += 1


class Engine:
    status = SimpleNamespace(device="cpu", dtype="fp32", geometry=ChunkGeometry(1, 8, 160, 16000))

    async def open(self) -> EngineSession:
        return EngineSession()

    def push(self, session: EngineSession, samples: Any) -> None:
        pass

    def end(self, session: EngineSession) -> None:
        pass

    def close(self, session: EngineSession) -> None:
        pass


async def connection(name: str, tokenizer: Tokenizer) -> Connection:
    face, interim = name.split("+")[0], name.endswith("+interim")
    engine: Any = Engine()
    state = StreamContext(Config(), engine, tokenizer, Metrics(process=False), "fastconformer-l-random")
    if face == "native":
        c = Connection(Socket("/v1/stream"), state, NativeStream)  # type: ignore[arg-type]
        c.session.receive(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le",
                                      "interim_results": interim, "endpointing": False}))
        c.session.proto._seq = 1  # as after `ready`
        await c.run_commands()
    elif face == "deepgram":
        query = "encoding=linear16&sample_rate=16000&endpointing=false" + "&interim_results=true" * interim
        c = Connection(Socket("/v1/listen?" + query), state, ListenStream)  # type: ignore[arg-type]
        c.session.begin(c.face.options.start())  # type: ignore[attr-defined]
        c.sender = SimpleNamespace()  # type: ignore[assignment]  # never done: no backlog here
        await c.run_commands()
    else:
        c = Connection(Socket("/v1/realtime"), state, RealtimeStream)  # type: ignore[arg-type]
        events = c.face.events  # type: ignore[attr-defined]  # the session settings' owner: RealtimeFace
        events.config = events.config.__class__(rate=16000, vad=False)
    return c


async def run(name: str, tokenizer: Tokenizer, cycles: int) -> str:
    face = name.split("+")[0]
    clip = bench.speech_clip(bench.SPEECH, 40)
    labels = json.loads((HERE / "fcl-random-labels.json").read_text())
    pcm = clip.pcm + bytes(round(1.6 * clip.rate) * 2)
    frames = round(len(pcm) / 2 / clip.rate / FRAME_S)  # of one utterance: speech and silence
    at: dict[int, list[int]] = {}
    for token, frame in zip(labels["tokens"], labels["timestamps"]):
        at.setdefault(frame, []).append(token)
    c = await connection(name, tokenizer)
    audio_s = result_s = 0.0
    audio_n = result_n = 0
    frame = 0  # of the stream; labels repeat every 3 utterances
    for cycle in range(cycles):
        first = frame
        for step in range(frames // STEP_FRAMES):
            messages: list[str | bytes] = []
            for m in range(STEP_FRAMES * 2):
                piece = pcm[(step * STEP_FRAMES * 2 + m) * MESSAGE:][:MESSAGE] or bytes(MESSAGE)
                event = {"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()}
                messages.append(json.dumps(event) if face == "realtime" else piece)
            t = time.process_time()
            for message in messages:
                if face == "native":
                    c.session.receive(message)
                    await c.run_commands()
                elif face == "deepgram":
                    await c.face.handle(message)  # type: ignore[attr-defined]
                elif audio := await c.face.handle(message):  # type: ignore[attr-defined]  # Realtime: the append's audio
                    await c.face.append(audio)  # type: ignore[attr-defined]
            audio_s += time.process_time() - t
            audio_n += len(messages)
            tokens, times = [], []
            for f in range(frame, frame + STEP_FRAMES):
                for token in at.get(f % (3 * frames), []):
                    tokens.append(token)
                    times.append(f - first)
            segment = c.session.segment
            assert segment is not None
            t = time.process_time()
            await c.deliver_all(c.session.receive_result(segment, ChunkResult(tokens, times, frame - first,
                                                                                frame - first + STEP_FRAMES)))
            result_s += time.process_time() - t
            result_n += 1
            frame += STEP_FRAMES
        ended = c.session.segment
        end = {"native": "finalize", "deepgram": "Finalize", "realtime": "input_audio_buffer.commit"}[face]
        if face == "native":
            c.session.receive(json.dumps({"type": end}))
            await c.run_commands()
        else:
            await c.face.handle(json.dumps({"type": end}))  # type: ignore[attr-defined]
        assert ended is not None
        await c.deliver_all(c.session.segment_flushed(ended))
    sent = c.ws.sent / cycles  # type: ignore[attr-defined]
    return (f"| {name} | {1e6 * audio_s / audio_n:.0f} | {1e6 * result_s / result_n:.0f} | {sent:.1f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faces", default=",".join(FACES))
    p.add_argument("--cycles", type=int, default=30, help="utterances per face (default: 30)")
    args = p.parse_args()
    tokenizer = random_tokenizer()
    print("| face | µs CPU per 40 ms audio message | µs CPU per result (a stream's step) | messages sent per "
          "utterance |")
    print("|---|---:|---:|---:|")
    for name in args.faces.split(","):
        print(asyncio.run(run(name, tokenizer, args.cycles)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
