"""Resume after a dropped connection, on one daemon (no load balancer): the raw protocol
(`resume` in `start`, the `resumed` answer, the replay after `last_seq`), the client library
(`ResumingStream`: resend on the same daemon, replay to a new session), handoff, and parked
sessions that make room for new streams."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import multiprocessing
import random
import socket
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import websockets

from daemon import config, running
from streamd.admin_client import request
from streamd.clients.resume import ReplayBuffer, ResumingStream
from streamd.config import AdminConfig
from streamd.protocol import Final, Start
from streamd.server.census import Census
from test_daemon import WAVS, pcm_of

START = Start(sample_rate=16000, encoding="s16le", interim_results=False, word_times=True)
PCM = b"".join(pcm_of(w) for w in WAVS)  # about 11 s


def final_dicts(finals: list[Final]) -> list[dict[str, Any]]:
    """Finals without `audio_processed` (it depends on how far ahead the audio was sent)."""
    return [{k: v for k, v in dataclasses.asdict(f).items() if k != "audio_processed"} for f in finals]


async def run_stream(url: str, pcm: bytes, piece: int = 3200, pace_s: float = 0.0,
                     hook: Any = None) -> tuple[list[Final], ResumingStream]:
    """Stream `pcm` through a ResumingStream; `hook(stream, offset)` runs before each message."""
    async with ResumingStream(url, START) as stream:
        async def send() -> None:
            for i in range(0, len(pcm), piece):
                if hook is not None:
                    await hook(stream, i)
                await stream.send_audio(pcm[i:i + piece])
                if pace_s:
                    await asyncio.sleep(pace_s)
            await stream.stop()
        sender = asyncio.create_task(send())
        finals = [r async for r in stream.results() if isinstance(r, Final)]
        await sender
    return finals, stream


def test_a_dropped_connection_resumes_on_the_same_daemon_with_nothing_lost() -> None:
    async def main() -> None:
        async with running(config(resume_grace_s=10.0)) as (app, url):
            want, _ = await run_stream(url, PCM)
            assert len(want) >= 1 and want[-1].reason == "end_of_stream"

            async def drop(stream: ResumingStream, offset: int) -> None:
                if offset in (32000, 160000):  # twice, mid-stream: RST, no close frame
                    assert stream._ws is not None
                    stream._ws.transport.abort()
                    await asyncio.sleep(0.2)
            got, stream = await run_stream(url, PCM, pace_s=0.01, hook=drop)
            assert (stream.resumed, stream.replayed) == (2, 0)
            assert final_dicts(got) == final_dicts(want)
            assert stream.summary is not None and stream.summary.utterances == len(want)
            text = app.state.metrics.render().decode()
            assert 'streamd_resumes_total{result="resumed"} 2.0' in text

    asyncio.run(main())


def test_an_unknown_session_gets_a_new_one_and_the_client_replays_its_audio() -> None:
    async def main() -> None:
        async with running(config(resume_grace_s=10.0)) as (app, url):
            want, _ = await run_stream(url, PCM)

            async def forget(stream: ResumingStream, offset: int) -> None:
                if offset == 288000:  # 9 s in, after a final: the daemon loses the session (as another would)
                    app.state.sessions.handoff()
                    await asyncio.sleep(0.2)
            got, stream = await run_stream(url, PCM, pace_s=0.01, hook=forget)
            assert (stream.resumed, stream.replayed) == (0, 1)
            assert final_dicts(got) == final_dicts(want)  # no gap, no duplicate, same times

    asyncio.run(main())


def test_the_resume_protocol() -> None:
    """`resumed` repeats the client's last_seq, says what audio arrived, and the results after
    last_seq follow with their original seq; then the stream goes on."""
    start = json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le", "interim_results": False})

    async def main() -> None:
        async with running(config(resume_grace_s=10.0)) as (app, url):
            ws = await websockets.connect(url + "/v1/stream")
            assert ws.response is not None
            sid = ws.response.headers["X-Streamd-Session"]
            await ws.send(start)
            ready = json.loads(await ws.recv())
            assert ready["type"] == "ready" and ready["session_id"] == sid
            await ws.send(PCM[:64000])
            await ws.send(json.dumps({"type": "finalize"}))
            seen = [ready]
            while seen[-1].get("reason") != "finalize":
                seen.append(json.loads(await ws.recv()))
            await ws.send(PCM[64000:96000])
            while app.state.metrics.registry.get_sample_value("streamd_audio_seconds_total") != 3.0:
                await asyncio.sleep(0.01)
            ws.transport.abort()
            while app.state.sessions.parked != 1:
                await asyncio.sleep(0.01)

            last_seq = seen[-2]["seq"]  # the client missed the finalize's final
            ws = await websockets.connect(url + f"/v1/stream?session={sid}")
            await ws.send(json.dumps({**json.loads(start), "resume": {"session_id": sid, "secret": ready["resume_secret"],
                                                                      "last_seq": last_seq}}))
            resumed = json.loads(await ws.recv())
            assert resumed == {"type": "resumed", "seq": last_seq, "session_id": sid, "audio_bytes": 96000,
                               "finalizes": 1}
            assert json.loads(await ws.recv()) == seen[-1]  # replayed with its seq
            await ws.send(PCM[96000:128000])
            await ws.send(json.dumps({"type": "stop"}))
            rest = [json.loads(m) async for m in ws]
            first = seen[-1]["seq"] + 1
            assert [m["seq"] for m in rest] == list(range(first, first + len(rest)))
            assert rest[-1]["type"] == "summary" and rest[-1]["audio_seconds"] == 4.0
            assert ws.close_code == 1000

            # A session that is gone (or never was): a new session, `ready` with another id.
            ws = await websockets.connect(url + "/v1/stream")
            await ws.send(json.dumps({**json.loads(start), "resume": {"session_id": sid, "last_seq": 3}}))
            ready = json.loads(await ws.recv())
            assert ready["type"] == "ready" and ready["session_id"] != sid
            await ws.close()
            bad = json.dumps({**json.loads(start), "resume": {"session_id": "", "last_seq": 0}})
            ws = await websockets.connect(url + "/v1/stream")
            await ws.send(bad)
            assert json.loads(await ws.recv())["code"] == "protocol_violation"
            await ws.close()

    asyncio.run(main())


@pytest.mark.parametrize("workers", [0, 2])
def test_handoff_closes_every_stream_with_1012_and_refuses_new_ones(tmp_path: Path, workers: int) -> None:
    """In the engine's process, and from front-end processes (the drain reaches each of them)."""
    sock = tmp_path / "admin.sock"

    async def main() -> None:
        async with running(config(admin=AdminConfig(socket=sock), resume_grace_s=10.0, workers=workers)) as (app, url):
            streams = [await websockets.connect(url + "/v1/stream") for _ in range(3)]
            for ws in streams:
                await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"}))
                await ws.recv()
                await ws.send(PCM[:32000])
            status, body = await asyncio.to_thread(request, "POST", "/v1/drain", {"handoff": True}, socket_path=sock)
            assert status == 200 and body["handed_off"] == 3 and body["draining"]
            for ws in streams:
                with pytest.raises(websockets.ConnectionClosed):
                    while True:
                        await ws.recv()
                assert ws.close_code == 1012
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(url + "/v1/stream")
            assert refused.value.response.status_code == 503
            assert app.state.sessions.parked == 0  # handed-off streams are not kept for a resume here
            status, body = await asyncio.to_thread(request, "POST", "/v1/drain", {"handoff": 1}, socket_path=sock)
            assert status == 400

    asyncio.run(main())


def test_parked_sessions_give_their_slot_to_new_streams() -> None:
    async def main() -> None:
        async with running(config(max_streams=2, resume_grace_s=30.0)) as (app, url):
            for _ in range(2):
                ws = await websockets.connect(url + "/v1/stream")
                await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"}))
                await ws.recv()
                ws.transport.abort()
            while app.state.sessions.parked != 2:
                await asyncio.sleep(0.01)
            want, _ = await run_stream(url, PCM[:64000])  # takes the slot of one parked stream
            assert want and app.state.sessions.parked == 1

    asyncio.run(main())


def test_replay_buffer_positions() -> None:
    buf = ReplayBuffer(frame_bytes=2, rate=16000, max_bytes=10 ** 9)
    buf.audio(b"a" * 100)
    buf.finalize()
    buf.audio(b"b" * 50)
    assert buf.after(100, 0) == [None, b"b" * 50]
    assert buf.after(120, 1) == [b"b" * 30]
    buf.fresh_after(1, next_utterance=3)  # the finalize's final came: replays start after it
    assert (buf.base_bytes, buf.base_utterance, buf.everything()) == (100, 3, [b"b" * 50])
    assert buf.after(99, 1) is None  # no longer held
    small = ReplayBuffer(frame_bytes=2, rate=100, max_bytes=100)
    small.audio(bytes(300))  # 1.5 s
    small.bound(Final(0, "x", 0.2, 0.5, 1.0, "endpoint"))
    assert (small.base_bytes, small.base_utterance, small.held) == (100, 1, 200)
    assert np.isclose(small.base_seconds, 0.5)


def test_only_the_owner_resumes_a_session_and_logs_hold_no_id_or_secret(caplog: pytest.LogCaptureFixture) -> None:
    """The session id alone (it travels in URLs and the handshake answer) resumes nothing: a second
    client that has it gets a new session and the owner's stream goes on, live or parked; the
    owner, with the resume secret from `ready`, resumes it. A live connection is never taken over
    silently. No INFO log line holds a session id or a secret."""
    start = {"type": "start", "sample_rate": 16000, "encoding": "s16le", "interim_results": False}
    seen: set[str] = set()

    async def intruder(url: str, sid: str, secret: str | None) -> None:
        resume: dict[str, Any] = {"session_id": sid, "last_seq": 0}
        if secret is not None:
            resume["secret"] = secret
        async with websockets.connect(url + f"/v1/stream?session={sid}") as ws:
            await ws.send(json.dumps({**start, "resume": resume}))
            first = json.loads(await ws.recv())
            assert first["type"] == "ready" and first["session_id"] != sid, first  # a new session, nothing replayed
            seen.update((first["session_id"], first["resume_secret"]))
            await ws.send(json.dumps({"type": "stop"}))
            rest = [json.loads(m) async for m in ws]
            assert [m["type"] for m in rest] == ["final", "summary"] and rest[0]["text"] == ""

    async def main() -> None:
        async with running(config(resume_grace_s=10.0)) as (app, url):
            owner = await websockets.connect(url + "/v1/stream")
            await owner.send(json.dumps(start))
            ready = json.loads(await owner.recv())
            sid, secret = ready["session_id"], ready["resume_secret"]
            seen.update((sid, secret))
            assert len(secret) >= 32 and secret not in owner.response.headers.values()
            await owner.send(PCM[:64000])
            await owner.send(json.dumps({"type": "finalize"}))
            final = json.loads(await owner.recv())
            assert final["type"] == "final" and final["text"]

            for guess in (None, "", secret[:-1] + ("A" if secret[-1] != "A" else "B")):
                await intruder(url, sid, guess)  # the live session is not taken over
            await owner.send(PCM[64000:96000])
            await owner.send(json.dumps({"type": "finalize"}))
            assert json.loads(await owner.recv())["seq"] == final["seq"] + 1  # the owner's stream goes on

            owner.transport.abort()
            while app.state.sessions.parked != 1:
                await asyncio.sleep(0.01)
            await intruder(url, sid, None)  # nor the parked one
            assert app.state.sessions.parked == 1

            back = await websockets.connect(url + f"/v1/stream?session={sid}")
            await back.send(json.dumps({**start, "resume": {"session_id": sid, "secret": secret,
                                                            "last_seq": final["seq"]}}))
            resumed = json.loads(await back.recv())
            assert resumed["type"] == "resumed" and resumed["audio_bytes"] == 96000
            assert json.loads(await back.recv())["reason"] == "finalize"  # replayed

            # The owner again, while `back` still looks alive: `back` is told, not cut silently.
            again = await websockets.connect(url + "/v1/stream")
            await again.send(json.dumps({**start, "resume": {"session_id": sid, "secret": secret,
                                                             "last_seq": final["seq"] + 1}}))
            assert json.loads(await again.recv())["type"] == "resumed"
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(back.recv(), 5)
            assert back.close_code == 4409 and "another connection" in back.close_reason
            await again.send(json.dumps({"type": "stop"}))
            assert [json.loads(m)["type"] async for m in again][-1] == "summary"
            text = app.state.metrics.render().decode()
            assert 'streamd_resumes_total{result="refused"} 4.0' in text
            assert 'streamd_resumes_total{result="resumed"} 2.0' in text

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    logged = "\n".join(r.getMessage() + " " + str(vars(r)) for r in caplog.records)
    assert "parked" in logged and "resumed after seq" in logged
    leaked = [s for s in seen if s in logged]
    assert not leaked, f"session ids or secrets in the log: {leaked}"


async def _park(url: str, app: Any, n: int) -> None:
    """`n` streams whose clients vanish (TCP reset): parked."""
    for _ in range(n):
        ws = await websockets.connect(url + "/v1/stream")
        await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"}))
        await ws.recv()
        await ws.send(PCM[:8000])
        ws.transport.abort()
    while app.state.sessions.parked != n:
        await asyncio.sleep(0.01)


async def _first_answer(url: str, finalize: bool = False) -> str:
    """Open a stream at once: `ready`, an error code, or the HTTP status that refused it."""
    try:
        async with websockets.connect(url + "/v1/stream") as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"}))
            first = json.loads(await ws.recv())
            if first["type"] != "ready":
                return str(first["code"])
            await ws.send(PCM[:32000])
            if finalize:
                await ws.send(json.dumps({"type": "finalize"}))
                await ws.send(PCM[32000:48000])
            await ws.send(json.dumps({"type": "stop"}))
            last = [json.loads(m) async for m in ws][-1]
            return "ready" if last["type"] == "summary" else str(last.get("code"))
    except websockets.InvalidStatus as e:
        return str(e.response.status_code)


def test_a_full_daemon_of_parked_streams_takes_as_many_new_ones_at_once() -> None:
    """Every parked stream's slot goes to a new stream, however many come at once."""
    n = 6

    async def main() -> None:
        async with running(config(max_streams=n, resume_grace_s=30.0)) as (app, url):
            await _park(url, app, n)
            answers = await asyncio.gather(*(_first_answer(url) for _ in range(n)))
            assert answers == ["ready"] * n
            assert app.state.sessions.parked == 0

    asyncio.run(main())


async def _front_end_of(url: str, app: Any, local_port: int = 0) -> tuple[Any, int]:
    """A stream connection (no `start` yet) from `local_port` (0: any), and the front end that took it."""
    census = app.fronts.census
    before = list(census.slots)
    ws = await websockets.connect(url + "/v1/stream", local_addr=("127.0.0.1", local_port))
    async with asyncio.timeout(5):
        while list(census.slots) == before:
            await asyncio.sleep(0.005)
    return ws, next(i for i, (a, b) in enumerate(zip(before, census.slots)) if b > a)


async def _reset(ws: Any, app: Any) -> None:
    """Drop a connection that sent no `start` with a TCP reset (its port is free again at once, no
    TIME_WAIT), and wait until its front end has let it go."""
    census = app.fronts.census
    left = census.total() - 1
    ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ws.transport.abort()
    async with asyncio.timeout(5):
        while census.total() > left:
            await asyncio.sleep(0.005)


def test_parked_streams_in_one_front_end_give_their_slots_to_new_streams_at_another() -> None:
    """With front-end processes, a new stream takes the slot of the stream parked longest in the
    daemon, whichever front end holds it. SO_REUSEPORT picks a connection's front end by its
    addresses: the new streams come from local ports that front end 1 took, the parked streams
    are in front end 0."""
    n = 4

    async def main() -> None:
        async with running(config(max_streams=n, resume_grace_s=30.0, workers=2,
                                  idle_timeout_s=5.0)) as (app, url):
            census = app.fronts.census
            ports: list[int] = []  # local ports whose connections front end 1 takes
            candidates = iter(random.Random(0).sample(range(20000, 30000), 2000))  # below the ephemeral range
            while len(ports) < n:
                port = next(candidates)
                try:
                    ws, front = await _front_end_of(url, app, port)
                except OSError:  # the port is taken
                    continue
                await _reset(ws, app)
                if front == 1:
                    ports.append(port)
            parked = 0
            while parked < n:  # park n streams in front end 0
                ws, front = await _front_end_of(url, app)
                if front == 1:
                    await _reset(ws, app)
                    continue
                await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"}))
                await ws.recv()
                await ws.send(PCM[:8000])
                ws.transport.abort()
                parked += 1
                async with asyncio.timeout(5):
                    while census.parked[0] < parked:
                        await asyncio.sleep(0.005)
            assert census.parked_total() == census.total() == n

            held = []  # the new streams stay open (a stream that closes would be parked)

            async def newcomer(port: int) -> str:
                try:
                    ws, front = await _front_end_of(url, app, port)
                except websockets.InvalidStatus as e:
                    return str(e.response.status_code)
                held.append(ws)
                assert front == 1
                await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"}))
                first = json.loads(await ws.recv())
                return "ready" if first["type"] == "ready" else str(first["code"])

            answers = [await newcomer(port) for port in ports]
            assert answers == ["ready"] * n
            assert census.parked_total() == 0
            for ws in held:
                await ws.send(json.dumps({"type": "stop"}))
                await ws.wait_closed()

    asyncio.run(main())


def test_the_census_names_the_front_end_holding_the_stream_parked_longest() -> None:
    census = Census(multiprocessing.get_context("spawn"), 3)
    assert census.parked_longest() is None
    census.set(0, 5, SimpleNamespace(parked=1, evicted=0, parked_since=20.0))
    census.set(1, 2, SimpleNamespace(parked=2, evicted=1, parked_since=10.0))
    census.set(2, 1, SimpleNamespace(parked=0, evicted=1, parked_since=math.inf))
    assert census.parked_longest() == 1
    assert (census.total(), census.parked_total(), census.evicted_total()) == (8, 3, 2)
    census.set(1, 0)  # front end 1 is gone
    assert census.parked_longest() == 0 and census.parked_total() == 1


def test_a_finalize_in_flight_does_not_turn_an_admitted_stream_away() -> None:
    """A stream whose finalize is in flight holds a second engine slot until the first segment is
    flushed; a stream the daemon admitted meanwhile waits for a slot instead of `overloaded`."""
    async def main() -> None:
        async with running(config(max_streams=2, max_backlog_s=120.0)) as (app, url):
            ws = await websockets.connect(url + "/v1/stream")
            await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"}))
            await ws.recv()
            for i in range(0, len(PCM) * 4, 64000):  # about 45 s at once: its segment takes a while to flush
                await ws.send((PCM * 4)[i:i + 64000])
            await ws.send(json.dumps({"type": "finalize"}))
            async with asyncio.timeout(10):
                while app.state.engine.recognizer.active < 2:
                    await asyncio.sleep(0.002)
            assert await _first_answer(url) == "ready"
            await ws.close()

    asyncio.run(main())
