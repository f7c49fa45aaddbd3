"""`server.workers`: websocket front ends in their own processes on one port, the engine here.

Everything a stream sees must be what the one-process daemon gives: the same tokens, metrics that
count every front end's streams, the capacity limit over the whole daemon, drain and cut-over
flags reaching every front end, migrations under way, shutdown, and a front end that dies."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from pathlib import Path

import numpy as np
import pytest
import websockets

from daemon import config, running, stream_pcm
from streamd.config import AdminConfig
from test_daemon import WAVS, decode_reference, fetch, pcm_of
from test_migration import streams_with_migrations

pytestmark = pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="needs SO_REUSEPORT")


def metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")
               or line.startswith(name + "{"))


def test_front_ends_serve_what_one_process_serves(tmp_path: Path) -> None:
    ref = decode_reference()
    sock = tmp_path / "admin.sock"

    async def main() -> None:
        async with running(config(max_streams=24, workers=2, admin=AdminConfig(socket=sock))) as (app, url):
            results = await asyncio.gather(*(stream_pcm(url, pcm_of(WAVS[i % len(WAVS)]), np.random.default_rng(i))
                                             for i in range(20)))
            for i, t in enumerate(results):
                assert t.close_code == 1000 and t.messages[-1]["type"] == "summary"
                assert [m["seq"] for m in t.messages] == list(range(len(t.messages)))
                assert t.pieces == ref[str(WAVS[i % len(WAVS)])], i
            assert app.state.engine.recognizer.active == 0
            # /metrics from whichever front end answers counts the streams of both (pushed every second)
            await asyncio.sleep(1.5)
            text = (await fetch(url, "/metrics"))[1]
            assert metric(text, "streamd_connections_total") == 20
            assert metric(text, "streamd_streams_active") == 0
            assert metric(text, "streamd_batch_size_count") > 0  # the engine's own metrics are there too
            assert metric(text, "streamd_final_latency_seconds_count") >= 20
            # the audio came through the front ends' shared-memory pipes, none inline
            assert metric(text, 'streamd_front_audio_messages_total{path="shared"}') > 0
            assert metric(text, 'streamd_front_audio_messages_total{path="inline"}') == 0
            # each front end watches its event loop (10 wake-ups a second) and counts its CPU time
            assert metric(text, "streamd_event_loop_lag_seconds_count") > 0
            assert metric(text, "streamd_front_cpu_seconds_total") > 0
            # the capacity limit holds for the daemon, not per front end: 24 open across both
            held = [await websockets.connect(url + "/v1/stream") for _ in range(24)]
            await asyncio.sleep(0.1)
            with pytest.raises(websockets.InvalidStatus) as exc:
                await websockets.connect(url + "/v1/stream")
            assert exc.value.response.status_code == 503
            for ws in held:
                await ws.close()
            # a live migration while streams run; then a drain reaches every front end
            baseline, _ = await streams_with_migrations(sock, url, [])
            moved, reports = await streams_with_migrations(sock, url, ["bf16", "fp32"])
            assert all(r["moved"] for r in reports)
            for a, b in zip(baseline, moved):
                assert b.close_code == 1000 and b.of("final")
                assert b.messages[-1]["audio_seconds"] == pytest.approx(a.messages[-1]["audio_seconds"])
            app.control.drain()
            await asyncio.sleep(0.2)
            codes = {(await fetch(url, "/readyz"))[0] for _ in range(8)}
            assert codes == {503}

    asyncio.run(main())


def test_a_front_end_that_dies_frees_its_slots_and_the_other_serves_on() -> None:
    async def main() -> None:
        async with running(config(max_streams=16, workers=2)) as (app, url):
            fronts = app.fronts
            assert fronts is not None
            held = [await websockets.connect(url + "/v1/stream") for _ in range(8)]
            for ws in held:
                await ws.send('{"type": "start", "sample_rate": 16000, "encoding": "s16le"}')
                assert '"ready"' in await ws.recv()
            assert app.state.engine.recognizer.active == 8
            index = max(range(2), key=lambda i: fronts.census.slots[i])  # the one holding most streams
            victim = fronts.bridges[index].process
            os.kill(victim.pid, signal.SIGKILL)
            for _ in range(100):
                if app.state.engine.recognizer.active < 8:
                    break
                await asyncio.sleep(0.05)
            assert app.state.engine.recognizer.active < 8  # the dead front end's streams lost their slots
            assert fronts.census.slots[index] == 0
            for _ in range(200):  # and it is replaced
                if fronts.bridges[index].process is not victim and fronts.bridges[index].up.done():
                    break
                await asyncio.sleep(0.05)
            assert fronts.bridges[index].up.result() != victim.pid
            t = await stream_pcm(url, pcm_of(WAVS[0]), np.random.default_rng(0))
            assert t.close_code == 1000 and t.of("final")
            for ws in held:
                await ws.close()

    asyncio.run(main())


def test_metrics_and_readyz_through_front_ends_never_fail() -> None:
    """/metrics and /readyz every 100 ms through the front ends, idle and under load (and while
    the daemon starts, its event loop stays free: front ends are spawned off it)."""
    async def main() -> None:
        lag = 0.0

        async def ticker() -> None:
            nonlocal lag
            loop = asyncio.get_running_loop()
            while True:
                t = loop.time()
                await asyncio.sleep(0.02)
                lag = max(lag, loop.time() - t - 0.02)

        ticks = asyncio.create_task(ticker())
        async with running(config(max_streams=24, workers=2)) as (app, url):
            assert app.fronts is not None
            ticks.cancel()
            spawn_lag = lag
            seen: list[tuple[str, int, str]] = []
            stop = asyncio.Event()

            async def scrape() -> None:
                while not stop.is_set():
                    for path in ("/metrics", "/readyz"):
                        code, body = await fetch(url, path)
                        seen.append((path, code, body))
                    await asyncio.sleep(0.1)

            scraper = asyncio.create_task(scrape())
            await asyncio.sleep(1.0)  # idle, just started
            results = await asyncio.gather(*(stream_pcm(url, pcm_of(WAVS[i % len(WAVS)]), np.random.default_rng(i),
                                                        max_piece=3000, pace_s=0.03) for i in range(16)))
            stop.set()
            await scraper
        assert all(t.close_code == 1000 for t in results)
        assert len(seen) >= 20 and {code for _, code, _ in seen} == {200}, [(p, c, b) for p, c, b in seen if c != 200]
        texts = [body for path, _, body in seen if path == "/metrics"]
        assert all("streamd_batch_size_count" in t and "did not answer" not in t for t in texts)
        assert spawn_lag < 1.0, f"the event loop was held {spawn_lag:.2f} s while the front ends started"

    asyncio.run(main())


def test_a_stalled_engine_fails_livez_and_readyz_in_every_front_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog finds the engine thread stalled (a GPU call that never returns): every front
    end answers /livez and /readyz with 503 and refuses new streams (an orchestrator restarts the
    daemon, a load balancer sends streams elsewhere); all back to 200 once steps go on."""
    from streamd.engine.engine import Engine
    from streamd.server import app as app_module

    stalled = False
    real = Engine.stalled
    monkeypatch.setattr(app_module, "STALL_CHECK_S", 0.05)
    monkeypatch.setattr(Engine, "stalled", lambda self, limit_s: "simulated: blocked in a CUDA call" if stalled
                        else real(self, limit_s))

    async def codes(url: str) -> set[tuple[str, int, str]]:
        """What several requests (so, likely, both front ends) answer on each path."""
        seen = set()
        for _ in range(6):
            for path in ("/livez", "/readyz"):
                code, body = await fetch(url, path)
                seen.add((path, code, body if path == "/livez" else json.loads(body)["reason"] or ""))
        return seen

    async def main() -> None:
        nonlocal stalled
        async with running(config(max_streams=8, workers=2)) as (app, url):
            assert await codes(url) == {("/livez", 200, "ok\n"), ("/readyz", 200, "")}
            stalled = True
            await asyncio.sleep(0.5)  # the watchdog looks; the status reaches the front ends
            assert app.state.engine.status.stalled and app.control.status()["stalled"]  # `streamd admin status` says so
            assert await codes(url) == {("/livez", 503, "engine stalled\n"), ("/readyz", 503, "stalled")}
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(url + "/v1/stream")
            assert refused.value.response.status_code == 503
            stalled = False
            await asyncio.sleep(0.5)
            assert await codes(url) == {("/livez", 200, "ok\n"), ("/readyz", 200, "")}
            ws = await websockets.connect(url + "/v1/stream")
            await ws.close()

    asyncio.run(main())
