"""Slow and hostile clients against a real daemon: one that never reads its results, handshakes
that never finish (silent, dripping headers, upgraded and then silent), a flood of connections
above capacity, and a thousand connections reset mid-chunk. Each leaves the daemon serving a
control stream exactly, with no slot, task, file descriptor or memory left behind."""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import websockets

from conftest import FIXTURES
from daemon import config, read_all, running, stream_pcm, Transcript
from streamd.server.app import App

SPEECH = sf.read(str(FIXTURES / "in3_espeak_sentence.wav"), dtype="int16")[0].tobytes()
START = {"type": "start", "sample_rate": 16000, "encoding": "s16le"}
VOLATILE = ("seq", "audio_processed")


def results(t: Transcript) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k not in VOLATILE} for m in t.messages if m["type"] in ("partial", "final")]


def load(app: App) -> tuple[int, float | None, int]:
    """(engine slots in use, streams_active gauge, live connection tasks)."""
    return (app.state.engine.recognizer.active,
            app.state.metrics.registry.get_sample_value("streamd_streams_active"), len(app.state.live))


async def settle(app: App, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while load(app) != (0, 0, 0):
        assert time.monotonic() < deadline, f"not released: (slots, streams_active, tasks) = {load(app)}"
        await asyncio.sleep(0.05)


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("ws://").split(":")
    return host, int(port)


REALTIME_16K = {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
    "format": {"type": "audio/pcm", "rate": 16000}}}}}


async def open_slow(url: str, endpoint: str) -> tuple[Any, Callable[[bytes], str | bytes]]:
    """A client connection whose receive buffer is small, set up to stream 16 kHz s16le, and how
    it wraps audio into a message."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(host_port(url))
    if endpoint == "native":
        ws = await websockets.connect(url + "/v1/stream", sock=sock, max_size=None)
        await ws.send(json.dumps({**START, "endpointing": False, "word_times": True}))
        assert json.loads(await ws.recv())["type"] == "ready"
        return ws, lambda pcm: pcm
    ws = await websockets.connect(url + "/v1/realtime?intent=transcription", sock=sock, max_size=None)
    assert json.loads(await ws.recv())["type"] == "session.created"
    await ws.send(json.dumps(REALTIME_16K))
    assert json.loads(await ws.recv())["type"] == "session.updated"
    return ws, lambda pcm: json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


@pytest.mark.parametrize("endpoint", ["native", "realtime"])
def test_a_client_that_never_reads_is_closed_with_its_buffer_bounded(endpoint: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Results pile up fast (native: endpointing off and word times on make the partials grow); the
    daemon's buffers for the slow client are shrunk (socket 4 KiB, websocket 1 KiB) to fill soon."""
    send_timeout = 1.0

    async def main() -> None:
        async with running(config(send_timeout_s=send_timeout)) as (app, url):
            want = results(await stream_pcm(url, SPEECH, np.random.default_rng(0)))
            ws, message = await open_slow(url, endpoint)
            ws.transport.pause_reading()  # from here on the client reads nothing
            (server_side,) = app.connections
            server_side.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            server_side.transport.set_write_buffer_limits(high=1024)
            rss0, t0, buffered = rss_mb(), time.monotonic(), 0
            beside = asyncio.create_task(stream_pcm(url, SPEECH, np.random.default_rng(1), pace_s=0.005))
            try:
                looped, i = SPEECH * 20, 0
                while server_side in app.connections and time.monotonic() - t0 < 30:
                    await ws.send(message(looped[i: i + 32000]))  # 1 s of audio every 0.1 s: decoding keeps up
                    i = (i + 32000) % (len(SPEECH) * 10)
                    buffered = max(buffered, server_side.transport.get_write_buffer_size())
                    await asyncio.sleep(0.1)
            except websockets.ConnectionClosed:
                pass
            closed_after = time.monotonic() - t0
            ws.transport.abort()
            assert results(await beside) == want
            await settle(app)
            assert closed_after < 20, "the slow client was never closed"
            assert buffered <= 1024 + 2**16  # the high-water mark plus one message
            assert rss_mb() - rss0 < 50

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    assert any("slow_consumer" in r.getMessage() for r in caplog.records)


async def closed_after(host: str, port: int, drip: bytes, limit: float) -> float | None:
    """Connect and send `drip` one byte every 50 ms (never a whole request); the seconds until the
    server closed the connection, or None if it was still open after `limit` seconds."""
    t0 = time.monotonic()  # before the connection: the server's timer starts when it accepts it
    reader, writer = await asyncio.open_connection(host, port)
    closed = asyncio.ensure_future(reader.read())  # ends at EOF or reset
    try:
        for byte in drip:
            if closed.done():
                break
            writer.write(bytes([byte]))
            await asyncio.wait([closed], timeout=0.05)
        await asyncio.wait_for(closed, max(0.0, limit - (time.monotonic() - t0)))
    except ConnectionError:
        pass
    except TimeoutError:
        return None
    finally:
        writer.close()
    return time.monotonic() - t0


async def upgraded_then_silent(url: str) -> Transcript:
    async with websockets.connect(url + "/v1/stream") as ws:
        return await read_all(ws, Transcript())


def test_slowloris_and_half_open_connections_are_cut() -> None:
    handshake, idle = 1.0, 2.0

    async def main() -> None:
        async with running(config(handshake_timeout_s=handshake, idle_timeout_s=idle)) as (app, url):
            want = results(await stream_pcm(url, SPEECH, np.random.default_rng(0)))
            host, port = host_port(url)
            t0 = time.monotonic()
            slowloris = b"GET /v1/stream HTTP/1.1\r\nHost: x\r\n" + b"X-Drip: 1\r\n" * 1000
            drips = [closed_after(host, port, slowloris, 10) for _ in range(40)]
            silents = [closed_after(host, port, b"", 10) for _ in range(40)]
            upgraded = [upgraded_then_silent(url) for _ in range(10)]
            control = stream_pcm(url, SPEECH, np.random.default_rng(2), pace_s=0.01)
            *cut, ctl = await asyncio.gather(*drips, *silents, control)
            halves = await asyncio.gather(*upgraded)
            assert results(ctl) == want
            assert all(c is not None and handshake <= c < handshake + 1.5 for c in cut), sorted(map(str, cut))
            for t in halves:
                assert [m["code"] for m in t.of("error")] == ["idle_timeout"] and t.close_code == 1008
            assert time.monotonic() - t0 < idle + 8
            await settle(app)

    asyncio.run(main())


def test_a_flood_above_capacity_gets_503_before_the_handshake() -> None:
    capacity, attempts = 8, 120

    async def main() -> None:
        async with running(config(max_streams=capacity)) as (app, url):
            release = asyncio.Event()
            opened: list[dict[str, Any]] = []

            async def attempt() -> tuple[int, str | None]:
                try:
                    ws = await websockets.connect(url + "/v1/stream")
                except websockets.InvalidStatus as e:
                    return e.response.status_code, e.response.headers.get("Retry-After")
                async with ws:
                    await ws.send(json.dumps(START))
                    opened.append(json.loads(await ws.recv()))
                    await release.wait()
                return 101, None

            tasks = [asyncio.create_task(attempt()) for _ in range(attempts)]
            while len(opened) + sum(t.done() for t in tasks) < attempts:
                await asyncio.sleep(0.02)
            release.set()
            outcomes = await asyncio.gather(*tasks)
            assert [m["type"] for m in opened] == ["ready"] * capacity  # never `overloaded` after a 101
            refused = [o for o in outcomes if o[0] != 101]
            assert len(refused) == attempts - capacity and all(o == (503, "1") for o in refused)
            assert app.state.metrics.registry.get_sample_value(
                "streamd_connections_rejected_total", {"reason": "overloaded"}) == attempts - capacity
            await settle(app)
            assert (await stream_pcm(url, SPEECH, np.random.default_rng(0))).close_code == 1000

    asyncio.run(main())


def test_a_thousand_resets_mid_chunk_leak_nothing() -> None:
    rounds, warm_up, parallel = 1000, 100, 16

    async def main() -> None:
        async with running(config()) as (app, url):
            want = results(await stream_pcm(url, SPEECH, np.random.default_rng(0)))
            rng = np.random.default_rng(3)
            gate = asyncio.Semaphore(parallel)

            async def reset(i: int) -> None:
                async with gate:
                    ws = await websockets.connect(url + "/v1/stream")
                    await ws.send(json.dumps(START))
                    if i % 3:
                        assert json.loads(await ws.recv())["type"] == "ready"
                    size = int(rng.integers(1, 35_840))  # less than one 1120 ms chunk: mid-chunk
                    await ws.send(SPEECH[:size])
                    if i % 7 == 0:
                        await asyncio.sleep(0.01)
                    ws.transport.get_extra_info("socket").setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    ws.transport.abort()  # RST, no close frame

            await asyncio.gather(*(reset(i) for i in range(warm_up)))
            await settle(app)
            rss0, fds0 = rss_mb(), open_fds()
            t0 = time.monotonic()
            await asyncio.gather(*(reset(i) for i in range(rounds)))
            took = time.monotonic() - t0
            await settle(app)
            assert open_fds() <= fds0 + 2
            assert rss_mb() - rss0 < 30, f"RSS grew {rss_mb() - rss0:.0f} MB over {rounds} resets"
            assert results(await stream_pcm(url, SPEECH, np.random.default_rng(4))) == want
            assert took < 120

    asyncio.run(main())


@pytest.mark.parametrize("endpoint", ["native", "realtime"])
def test_no_client_can_make_an_utterance_longer_than_the_server_limit(endpoint: str) -> None:
    """Endpointing off (native `"endpointing": false`, realtime `turn_detection: null`) and speech
    that goes on: the daemon still cuts at `utterance_limit_s` (a final at the cut, nothing lost),
    so no partial grows without bound."""
    limit_s = 1.5
    speech = SPEECH * 3

    async def main() -> None:
        async with running(config(utterance_limit_s=limit_s)) as (app, url):
            if endpoint == "native":
                start = {**START, "endpointing": {"max_utterance_ms": 0, "silence_after_speech_ms": 0}}
                out = await stream_pcm(url, speech, np.random.default_rng(0), start=start)
                assert out.of("ready")[0]["endpointing"]["max_utterance_ms"] == limit_s * 1000
                finals = out.of("final")
                cut = [f for f in finals if f["reason"] == "max_utterance"]
                spans = [f["end"] - f["start"] for f in finals]
                biggest = max(len(m["text"]) for m in out.of("partial") + finals)
                whole = " ".join(f["text"] for f in (await stream_pcm(url, speech, np.random.default_rng(0))).of("final"))
                assert len(whole) > 3 * biggest
            else:
                ws = await websockets.connect(url + "/v1/realtime?intent=transcription")
                await ws.recv()
                off = {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
                    "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}}}
                await ws.send(json.dumps(off))
                await ws.recv()
                for i in range(0, len(speech), 16000):
                    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(speech[i:i + 16000]).decode()}))
                events: list[dict[str, Any]] = []
                while sum(e["type"].endswith("completed") for e in events) < 3:
                    events.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
                await ws.close()
                cut = [e for e in events if e["type"].endswith("completed")]
                spans = [e["usage"]["seconds"] for e in cut]
                assert "input_audio_buffer.speech_stopped" not in {e["type"] for e in events}  # no server VAD
            assert len(cut) >= 3
            assert max(spans) <= limit_s + 0.08

    asyncio.run(main())


def test_the_resume_ring_is_bounded_in_bytes() -> None:
    from streamd.server.resume import RING_BYTES, ResumeState

    state = ResumeState("s")
    for seq in range(1000):
        state.record(seq, "x" * 10_000)
    assert state.sent_chars <= RING_BYTES and len(state.sent) == RING_BYTES // 10_000
    assert state.after(998) == ["x" * 10_000] and state.after(10) is None
