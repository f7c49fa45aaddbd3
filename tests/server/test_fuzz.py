"""A bounded run of the protocol fuzzer (tests/protocol_fuzz.py) against a real daemon: every
connection ends as docs/protocol.md says, none hangs, the daemon logs no error, a control stream
beside them keeps its exact transcript, and every slot is released. scripts/fuzz_protocol.py is
the long run."""
from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import pytest
import soundfile as sf

from conftest import FIXTURES
from daemon import config, running, stream_pcm
from protocol_fuzz import ANY, BAD_UTF8, CLEAN, CLIENT, PV, TOO_BIG, UA, documented_errors, problems, run, session
from streamd.server.app import App

SEED, SESSIONS, CONCURRENCY = 14, 200, 12
MAX_BYTES, IDLE_S = 64 * 1024, 1.0
SPEECH = FIXTURES / "in3_espeak_sentence.wav"
VOLATILE = ("seq", "audio_processed")
# A partial's `end` is never past the audio sent when it is made (docs/protocol.md): with other
# pacing (the control's pieces are random) its last word may end a few ms earlier.
VOLATILE_PARTIAL = (*VOLATILE, "end")


def results(messages: list[dict[str, object]]) -> list[dict[str, object]]:
    """The partials and finals, without what depends on the client's pacing."""
    return [{k: v for k, v in m.items() if k not in (VOLATILE_PARTIAL if m["type"] == "partial" else VOLATILE)}
            for m in messages if m["type"] in ("partial", "final")]


async def control(url: str, pcm: bytes, want: list[dict[str, object]], done: asyncio.Event) -> tuple[int, int]:
    """Stream `pcm` again and again until `done`; returns (runs, runs whose results differ from `want`)."""
    runs = bad = 0
    while not done.is_set() or runs == 0:
        t = await stream_pcm(url, pcm, np.random.default_rng(runs), max_piece=6400, pace_s=0.01)
        runs += 1
        bad += t.close_code != 1000 or results(t.messages) != want
    return runs, bad


async def idle(app: App, timeout: float = 15.0) -> tuple[int, float | None, int]:
    """Wait until no slot, stream gauge or connection task is in use; returns the last load. (A
    client that closed while the server was busy may hold its slot for websockets' 10 s close
    timeout: with 4 messages queued the server reads no further, and sees the TCP close late.)"""
    deadline = time.monotonic() + timeout
    while True:
        got = (app.state.engine.recognizer.active,
               app.state.metrics.registry.get_sample_value("streamd_streams_active"), len(app.state.live))
        if got == (0, 0, 0) or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.05)


def test_fuzzed_sessions_end_as_documented(caplog: pytest.LogCaptureFixture) -> None:
    errors = documented_errors()
    pcm = sf.read(str(SPEECH), dtype="int16")[0].tobytes()
    sessions = [session(np.random.default_rng([SEED, i]), MAX_BYTES) for i in range(SESSIONS)]

    async def main() -> None:
        async with running(config(idle_timeout_s=IDLE_S, max_message_bytes=MAX_BYTES)) as (app, url):
            want = results((await stream_pcm(url, pcm, np.random.default_rng(0))).messages)
            assert want
            done, gate = asyncio.Event(), asyncio.Semaphore(CONCURRENCY)
            beside = asyncio.create_task(control(url, pcm, want, done))

            async def one(i: int) -> list[str]:
                async with gate:
                    out = await run(url, sessions[i], IDLE_S + 10)
                return [f"session {i} ({sessions[i].label}): {p}" for p in problems(sessions[i], out, errors)] \
                    + [out.ending]

            found = await asyncio.gather(*(one(i) for i in range(SESSIONS)))
            done.set()
            runs, differ = await beside
            faults = [p for f in found for p in f[:-1]]
            assert not faults, "\n".join(faults[:20])
            assert runs >= 1 and differ == 0, f"{differ} of {runs} control runs changed"
            assert await idle(app) == (0, 0, 0)
            endings = {f[-1] for f in found}
            assert {CLEAN, CLIENT, PV, UA, "idle_timeout", BAD_UTF8} <= endings and endings & TOO_BIG, endings

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "the daemon logged errors"


def test_every_session_kind_has_a_documented_ending() -> None:
    """The generator itself: expectations only name documented errors, and every kind occurs."""
    errors = documented_errors()
    assert errors["protocol_violation"] == 1008 and errors["unsupported_audio"] == 1003
    kinds, expected = set(), set()
    for i in range(2000):
        s = session(np.random.default_rng([1, i]), MAX_BYTES)
        kinds.add(s.label.split("/")[0])
        expected |= s.expect
    assert kinds == {"start", "start_mutated", "start_damaged", "hostile_first", "binary_first", "control_first"}
    assert expected - {CLEAN, CLIENT, ANY, BAD_UTF8, *TOO_BIG} <= set(errors)
