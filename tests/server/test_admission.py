"""Admission by capacity: the real-time estimate from step times, and a daemon that refuses
(503 + Retry-After before the handshake, /readyz 503 "full") at the estimate."""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable

import pytest
import websockets

from daemon import config, running
from streamd.engine.probes import capacity_probe
from streamd.engine.recognizer import Recognizer
from streamd.server import app as app_module
from streamd.server.admission import Capacity, estimate, probe_sizes
from streamd.server.app import App, build_state
from streamd.server.metrics import Metrics
from test_daemon import fetch


def test_estimate_interpolates_and_extrapolates_the_step_time_curve() -> None:
    assert estimate([(1, 0.1), (4, 0.4), (16, 1.6)], 1.0, 1000) == 10  # between 4 and 16
    assert estimate([(1, 0.01), (4, 0.04), (16, 0.16)], 0.32, 1000) == 32  # past the last point
    assert estimate([(1, 0.01), (4, 0.04), (16, 0.16)], 0.32, 20) == 20  # capped
    assert estimate([(1, 2.0), (4, 3.0)], 1.0, 1000) == 1  # not even one stream keeps up: still serve one
    assert estimate([(1, 0.01), (8, 0.01)], 1.0, 500) == 500  # flat: as many as allowed
    assert estimate([(2, 0.1)], 1.0, 1000) == 20  # one point: its time per stream
    assert probe_sizes(64) == [1, 4, 16, 64] and probe_sizes(100) == [1, 4, 16, 64, 100]


def test_live_steps_move_the_estimate() -> None:
    changes: list[tuple[int, int]] = []
    cap = Capacity(chunk_s=1.0, max_streams=64, utilization=0.5, on_change=lambda e, lim: changes.append((e, lim)))
    cap.seed([(1, 0.005), (4, 0.02), (16, 0.08), (64, 0.32)])
    # Steps of 0.5 s hold 100 streams (5 ms each); streams at random phases are ready 100 per
    # half chunk: 200 streams.
    assert cap.estimate == 200 and cap.limit == 64
    for _ in range(300):  # the machine got four times slower
        cap.observe(0.32 * 4, 64)
        cap.observe(0.08 * 4, 16)
    assert cap.estimate == 50 and cap.limit == 50
    assert changes[-1] == (50, 50)
    off = Capacity(chunk_s=1.0, max_streams=64, utilization=0.5, enabled=False)
    off.seed([(1, 2.0)])
    assert off.limit == 64  # admission = "max_streams": the estimate is reported, not enforced


def test_a_daemon_refuses_streams_beyond_its_estimate() -> None:
    async def main() -> None:
        async with running(config(max_streams=8, admission="capacity")) as (app, url):
            status, body = await fetch(url, "/readyz")
            ready = json.loads(body)
            assert status == 200 and ready["ready"] and ready["limit"] == 8
            assert ready["capacity_estimate"] >= 8  # the tiny model is fast: max_streams binds
            cap = app.state.capacity
            assert cap is not None and len(cap.points()) == 3  # warm-up timed batches of 1, 4 and 8
            b = cap.budget_s
            for _ in range(300):  # steps become slow: a batch of 2 fills the step budget
                cap.observe(0.4 * b, 1)
                cap.observe(1.6 * b, 4)
            assert cap.estimate == int(2 / cap.utilization) == 4

            held = [await websockets.connect(url + "/v1/stream") for _ in range(4)]
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(url + "/v1/stream")
            assert refused.value.response.status_code == 503
            assert refused.value.response.headers["Retry-After"] == "1"
            status, body = await fetch(url, "/readyz")
            assert status == 503 and json.loads(body)["reason"] == "full" and json.loads(body)["streams"] == 4
            metrics = (await fetch(url, "/metrics"))[1]
            assert "streamd_capacity_streams 4.0" in metrics and "streamd_capacity_estimate_streams 4.0" in metrics
            assert 'streamd_connections_rejected_total{reason="overloaded"} 1.0' in metrics
            await held[0].close()
            while len(app.state.live) > 3:
                await asyncio.sleep(0.01)
            assert (await fetch(url, "/readyz"))[0] == 200
            for ws in held[1:]:
                await ws.close()

    asyncio.run(main())


def test_a_stop_while_the_capacity_probe_runs_ends_the_start_before_serving(monkeypatch: pytest.MonkeyPatch,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """SIGTERM (which sets `shutdown`) while the start times its batch sizes: the probe ends at its
    next size and the daemon stops without serving. On a CPU the largest sizes take seconds each
    (a minute in all at --max-streams 1200), and a stop used to wait for every one, then serve."""
    in_probe, measured = threading.Event(), []

    def probe(rec: Recognizer, sizes: list[int], seed: int = 0, stop: Callable[[], bool] = lambda: False
              ) -> list[tuple[int, float]]:
        def stop_after_the_first_size() -> bool:
            if len(measured) == 2:  # asked before size 1, between its two steps, now before size 4:
                in_probe.set()      # hold it until the stop comes
                deadline = time.monotonic() + 30
                while not stop() and time.monotonic() < deadline:
                    time.sleep(0.01)
            measured.append(None)
            return stop()
        out = capacity_probe(rec, sizes, seed, stop_after_the_first_size)
        measured.append(out)
        return out

    monkeypatch.setattr(app_module, "capacity_probe", probe)

    async def main() -> None:
        app = App(build_state(config(max_streams=8), Metrics(process=False)))
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        serving = asyncio.create_task(app.serve(started))
        await asyncio.to_thread(in_probe.wait, 30)
        app.state.shutdown.set()  # what SIGTERM's handler does
        await asyncio.wait_for(serving, 10)
        assert not started.done()

    with caplog.at_level(logging.INFO, logger="streamd"):
        asyncio.run(main())
    assert len(measured[-1]) == 1  # only the first of sizes 1, 4, 8 was timed
    assert "stopped by a signal while starting" in caplog.text
    assert "serving streamd" not in caplog.text and " on ws://" not in caplog.text
