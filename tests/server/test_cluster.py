"""Daemons behind a real HAProxy with the shipped configuration (deploy/haproxy), on loopback.

- 60 resumable streams (`streamd.clients.resume`, what `streamd transcribe` and `listen` use) over
  three daemons; meanwhile one daemon is SIGKILLed mid-utterance (and restarted, as systemd
  would), a few client connections drop (network blip: the stream resumes on its daemon), one
  daemon hands its live streams off (`admin drain --handoff`: they move to another) and the
  last one is drained (its streams finish there). Every stream's finals equal those of an
  undisturbed run.
- Admission: a daemon refuses streams beyond its capacity with 503 + Retry-After, HAProxy sends
  them to a daemon with room; when no daemon has room the client gets 503 + Retry-After.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
import websockets

from cluster import Cluster, cluster, needs_haproxy
from streamd.admin_client import request
from streamd.clients.resume import ResumingStream
from streamd.protocol import Final, Start
from streamd.server.resume import log_name
from test_daemon import WAVS, pcm_of

pytestmark = needs_haproxy
N_STREAMS = 60
START = Start(sample_rate=16000, encoding="s16le", interim_results=False, word_times=True)
PIECE = 3200  # 100 ms


def rotation(k: int) -> bytes:
    """The four fixture WAVs one after another, starting with the k-th (about 12.6 s)."""
    return b"".join(pcm_of(WAVS[(k + j) % len(WAVS)]) for j in range(len(WAVS)))


def final_dicts(finals: list[Final]) -> list[dict[str, Any]]:
    """Finals without `audio_processed` (it depends on how far ahead the audio was sent)."""
    return [{k: v for k, v in dataclasses.asdict(f).items() if k != "audio_processed"} for f in finals]


async def transcribe(url: str, pcm: bytes, realtime: bool, streams: list[ResumingStream] | None = None,
                     delay: float = 0.0) -> tuple[list[Final], ResumingStream]:
    await asyncio.sleep(delay)
    async with ResumingStream(url, START, attempts=30) as stream:
        if streams is not None:
            streams.append(stream)

        async def send() -> None:
            t0 = time.monotonic()
            for i in range(0, len(pcm), PIECE):
                if realtime:
                    await asyncio.sleep(max(0.0, t0 + i / 32000 - time.monotonic()))
                await stream.send_audio(pcm[i:i + PIECE])
            await stream.stop()
        sender = asyncio.create_task(send())
        finals = [r async for r in stream.results() if isinstance(r, Final)]
        await sender
    return finals, stream


def gauge(metrics: str, name: str) -> float:
    return float(next(line.split()[1] for line in metrics.splitlines() if line.startswith(name + " ")))


async def admin(c: Cluster, name: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    sock = next(d.admin for d in c.daemons if d.name == name)
    status, answer = await asyncio.to_thread(request, "POST" if body is not None else "GET", path, body,
                                             socket_path=sock)
    assert status == 200, answer
    return answer


def test_sixty_streams_survive_a_kill_a_blip_a_drain_and_a_handoff(tmp_path: Path) -> None:
    async def main() -> None:
        flags = ["--max-streams", "80"]
        async with cluster(tmp_path, {"a": flags, "b": flags, "c": flags}) as c:
            direct = f"ws://127.0.0.1:{c.daemons[0].port}"
            want = {k: final_dicts((await transcribe(direct, rotation(k), realtime=False))[0]) for k in range(len(WAVS))}
            assert all(want.values())

            live: list[ResumingStream] = []
            jobs = [asyncio.create_task(transcribe(c.url, rotation(i % len(WAVS)), True, live, delay=i * 0.02))
                    for i in range(N_STREAMS)]
            await asyncio.sleep(2.0)
            where = {d.name: gauge((await c.get(f"/daemons/{d.name}/metrics"))[1], "streamd_streams_active")
                     for d in c.daemons}
            assert sum(where.values()) == N_STREAMS and min(where.values()) >= 10, where  # least connections
            a, b, _ = c.daemons
            a.kill()  # mid-utterance: every stream is inside its audio
            restart = asyncio.create_task(a.start())
            for _ in range(300):  # a slow machine: a's streams have all moved on before the blip
                if sum(s.replayed for s in live) >= where["a"]:
                    break
                await asyncio.sleep(0.1)
            settled = [s for s in live if s.replayed == 0 and s._ws is not None]  # b's and c's own
            for stream in random.Random(0).sample(settled, 6):  # network blip: RST, no close frame
                assert stream._ws is not None
                stream._ws.transport.abort()
            for _ in range(300):  # the blipped streams resume on their daemon before b hands off
                if sum(s.resumed for s in live) >= 1:
                    break
                await asyncio.sleep(0.1)
            handed = await admin(c, "b", "/v1/drain", {"handoff": True})  # its streams move to c (or a)
            assert handed["handed_off"] > 0
            await asyncio.sleep(1.0)
            drained = await admin(c, "c", "/v1/drain", {})
            assert drained["draining"] and drained["streams"] > 0  # they finish on c
            await c.wait_state("c", "DOWN")
            results = await asyncio.gather(*jobs)
            await restart
            await c.wait_state("a", "UP")

            for i, (finals, stream) in enumerate(results):
                assert final_dicts(finals) == want[i % len(WAVS)], i  # no gap, no duplicate, same times
                assert stream.summary is not None and stream.summary.reason == "stop"
            replayed = sum(s.replayed for _, s in results)
            resumed = sum(s.resumed for _, s in results)
            assert replayed >= where["a"] + handed["handed_off"]  # every stream of a and b moved
            assert resumed >= 1  # blipped streams on b and c came back to their daemon
            status, body = await c.get("/daemons/a/metrics")
            assert status == 200 and "streamd_capacity_streams" in body
            print(f"\nstreams per daemon {where}; b handed off {handed['handed_off']}; "
                  f"{replayed} replays, {resumed} resumes on the same daemon")

    asyncio.run(main())


def test_streams_beyond_a_daemons_capacity_go_to_one_with_room(tmp_path: Path) -> None:
    start = json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"})

    async def open_stream(url: str) -> websockets.ClientConnection:
        ws = await websockets.connect(url + "/v1/stream")
        await ws.send(start)
        assert json.loads(await ws.recv())["type"] == "ready"
        return ws

    def session(ws: websockets.ClientConnection) -> str:
        """How the daemon's log names the stream's session (a digest of its id): its `connect` line
        (at debug) says which daemon took it."""
        assert ws.response is not None
        return log_name(str(ws.response.headers["X-Streamd-Session"]))

    async def main() -> None:
        debug = ["--log-level", "debug"]
        daemons = {"small": ["--max-streams", "1", *debug], "big": ["--max-streams", "4", *debug]}
        async with cluster(tmp_path, daemons) as c:
            small, big = c.daemons
            held = await asyncio.gather(*(open_stream(c.url) for _ in range(5)))
            ready = {d.name: json.loads((await d.get("/readyz"))[1]) for d in c.daemons}
            assert (ready["small"]["streams"], ready["big"]["streams"]) == (1, 4), ready
            assert ready["small"]["reason"] == ready["big"]["reason"] == "full"
            with pytest.raises(websockets.InvalidStatus) as refused:  # nobody has room
                await websockets.connect(c.url + "/v1/stream")
            assert refused.value.response.status_code == 503 and "Retry-After" in refused.value.response.headers
            with pytest.raises(websockets.InvalidStatus) as direct:
                await websockets.connect(f"ws://127.0.0.1:{small.port}/v1/stream")
            assert direct.value.response.status_code == 503 and direct.value.response.headers["Retry-After"] == "1"

            on_small = [ws for ws in held if any(f"connect {session(ws)} " in line for line in small.log)]
            assert len(on_small) == 1
            await on_small[0].close()
            await c.wait_state("small", "UP")
            ws = await open_stream(c.url)  # big is full: it goes to small
            assert any(f"connect {session(ws)} " in line for line in small.log)
            for w in [ws, *held]:
                await w.close()
            refused_here = gauge((await small.get("/metrics"))[1],
                                 'streamd_connections_rejected_total{reason="overloaded"}')
            print(f"\nsmall refused {refused_here:g} handshakes (HAProxy retried them on big)")

    asyncio.run(main())
