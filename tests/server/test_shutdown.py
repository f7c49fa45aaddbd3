"""Graceful shutdown of the real daemon process (`python -m streamd serve`) on SIGTERM and SIGINT:
it stops taking streams (/readyz and handshakes get 503), flushes every live stream (its finals,
then a `summary` with reason "shutdown", then close 1001) and exits 0 within the drain timeout,
even with a client that never reads."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import soundfile as sf
import websockets

from conftest import FIXTURES, REPO
from daemon import TINY, Transcript, read_all

DRAIN_TIMEOUT_S = 3.0
# Prefixes that end mid-utterance: each live stream is cut there when the daemon is told to stop.
PREFIXES = {"in3_espeak_sentence.wav": 2.6, "in1_am_tones_bursts_4p37s.wav": 2.3,
            "in0_harmonic_segments_3s.wav": 2.0}
FINALIZE_AT = {"in1_am_tones_bursts_4p37s.wav": 1.0}  # this stream also sends `finalize` there
START = json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le", "word_times": True})
SERVING = re.compile(r"serving .* on ws://([\d.]+):(\d+)/v1/stream")


def prefix(name: str) -> bytes:
    data, rate = sf.read(str(FIXTURES / name), dtype="int16")
    return data[: int(PREFIXES[name] * rate)].tobytes()


def stream_messages(name: str) -> list[str | bytes]:
    """What a live stream sends after `start`: its prefix, maybe split by a `finalize`."""
    pcm = prefix(name)
    if name not in FINALIZE_AT:
        return [pcm]
    cut = int(FINALIZE_AT[name] * 16000) * 2
    return [pcm[:cut], json.dumps({"type": "finalize"}), pcm[cut:]]


@dataclass
class Daemon:
    """A `streamd serve` child process and the stderr lines it wrote so far."""

    proc: asyncio.subprocess.Process
    url: str = ""
    log: list[str] = field(default_factory=list)

    async def get(self, path: str) -> int:
        """HTTP status of GET `path` on the daemon's port (from a worker thread)."""
        def get() -> int:
            try:
                with urllib.request.urlopen(self.url.replace("ws", "http", 1) + path, timeout=5) as r:
                    return int(r.status)
            except urllib.error.HTTPError as e:
                return e.code
        return await asyncio.to_thread(get)

    async def audio_seconds(self) -> float:
        """The daemon's `streamd_audio_seconds_total`."""
        def get() -> str:
            with urllib.request.urlopen(self.url.replace("ws", "http", 1) + "/metrics", timeout=5) as r:
                return str(r.read().decode())
        text = await asyncio.to_thread(get)
        return float(next(line.split()[1] for line in text.splitlines()
                          if line.startswith("streamd_audio_seconds_total")))


@contextlib.asynccontextmanager
async def daemon() -> AsyncIterator[Daemon]:
    """Start `python -m streamd serve` on a free port; kill it if the test leaves it running."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streamd", "serve", "--config", "", "--model", str(TINY), "--device", "cpu",
        "--port", "0", "--admin-socket", "", "--drain-timeout-s", str(DRAIN_TIMEOUT_S), "--gate-mode", "off",
        cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    d = Daemon(proc)
    bound: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def read_log() -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            d.log.append(raw.decode(errors="replace").rstrip())
            if (m := SERVING.search(d.log[-1])) and not bound.done():
                bound.set_result(f"ws://{m[1]}:{m[2]}")
        if not bound.done():
            bound.set_exception(RuntimeError("the daemon exited before serving:\n" + "\n".join(d.log)))

    reader = asyncio.create_task(read_log())
    try:
        d.url = await asyncio.wait_for(bound, 60)
        yield d
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await reader


async def clean_run(url: str, messages: list[str | bytes]) -> Transcript:
    """The same stream ended by `stop`: what a drained stream must have received."""
    async with websockets.connect(url + "/v1/stream") as ws:
        await ws.send(START)
        for m in messages:
            await ws.send(m)
        await ws.send(json.dumps({"type": "stop"}))
        return await read_all(ws, Transcript())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_drains_every_stream_then_exits_0(signum: int) -> None:
    async def main() -> None:
        async with daemon() as d:
            audio = {name: prefix(name) for name in PREFIXES}
            reference = {name: await asyncio.wait_for(clean_run(d.url, stream_messages(name)), 10)
                         for name in PREFIXES}
            for ref in reference.values():  # each prefix ends inside an utterance
                assert ref.close_code == 1000 and ref.messages[-1]["reason"] == "stop"
                last = [m for m in ref.messages if m["type"] == "final"][-1]
                assert last["reason"] == "end_of_stream" and last["tokens"]

            live = {name: await websockets.connect(d.url + "/v1/stream") for name in audio}
            for name, ws in live.items():
                await ws.send(START)
                for m in stream_messages(name):
                    await ws.send(m)
            readers = {name: asyncio.create_task(read_all(ws, Transcript())) for name, ws in live.items()}
            not_started = await websockets.connect(d.url + "/v1/stream")
            stuck = await websockets.connect(d.url + "/v1/stream")  # never reads, never answers the close
            await stuck.send(START)
            await stuck.send(audio["in3_espeak_sentence.wav"])
            stuck.transport.pause_reading()
            # Every byte sent so far has reached the engine (no stop: the streams are mid-utterance).
            sent = 2 * sum(len(pcm) for pcm in audio.values()) + len(audio["in3_espeak_sentence.wav"])
            deadline = time.monotonic() + 10
            while abs(await d.audio_seconds() - sent / 2 / 16000) > 1e-6:
                assert time.monotonic() < deadline, "the daemon did not receive all the audio"
                await asyncio.sleep(0.02)
            assert await d.get("/readyz") == 200

            d.proc.send_signal(signum)
            t0 = time.monotonic()
            drained = await asyncio.wait_for(asyncio.gather(*readers.values()), DRAIN_TIMEOUT_S)
            await asyncio.wait_for(not_started.wait_closed(), DRAIN_TIMEOUT_S)
            for name, out in zip(readers, drained):
                assert out.close_code == 1001, name
                assert out.messages[-1]["type"] == "summary" and out.messages[-1]["reason"] == "shutdown"
                assert out.messages[-1]["audio_seconds"] == pytest.approx(len(audio[name]) / 2 / 16000, abs=1e-3)
                assert out.results == reference[name].results, name  # every token of the audio sent
            assert not_started.close_code == 1001

            # The stuck client holds the drain open: the daemon refuses new work meanwhile.
            assert d.proc.returncode is None
            assert await d.get("/readyz") == 503
            assert await d.get("/livez") == 200
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(d.url + "/v1/stream")
            assert refused.value.response.status_code == 503
            assert "Retry-After" in refused.value.response.headers

            rc = await asyncio.wait_for(d.proc.wait(), DRAIN_TIMEOUT_S + 5)
            exited = time.monotonic() - t0
            assert rc == 0, "\n".join(d.log)
            assert DRAIN_TIMEOUT_S <= exited < DRAIN_TIMEOUT_S + 1.5, exited
            stuck.transport.abort()
            assert any("draining 5 streams" in line for line in d.log), d.log[-5:]

    asyncio.run(main())
