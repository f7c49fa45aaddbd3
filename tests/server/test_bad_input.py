"""Limits and bad input against a real daemon: every case gets the documented `error` and close
code (docs/protocol.md), while bystander streams that are live at the same time transcribe exactly
as in a clean run, and the daemon serves a new stream afterwards with every slot released."""
from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import soxr
import websockets
from websockets.asyncio.client import ClientConnection

from conftest import FIXTURES
from daemon import config, running
from streamd.config import Config
from streamd.server.app import App

SPEECH = FIXTURES / "in3_espeak_sentence.wav"
TONES = FIXTURES / "in1_am_tones_bursts_4p37s.wav"
START: dict[str, Any] = {"type": "start", "sample_rate": 16000, "encoding": "s16le", "word_times": True}
STOP = json.dumps({"type": "stop"})
KEEPALIVE = json.dumps({"type": "keepalive"})
PIECE = 3200  # bytes of s16le per bystander message: 100 ms, under every max_message_bytes used here
VOLATILE = ("seq", "audio_processed")  # depend on timing, not on the audio


def samples(path: Path) -> np.ndarray:
    """int16 mono samples of a 16 kHz fixture."""
    data, rate = sf.read(str(path), dtype="int16")
    assert rate == 16000
    return data


def start(**fields: Any) -> str:
    return json.dumps({**START, **fields})


@dataclass
class Outcome:
    """Everything one client saw: server messages, the close frame, and when it came."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""
    seconds: float = 0.0  # from connecting to the close

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == kind]

    @property
    def results(self) -> list[dict[str, Any]]:
        """Partials and finals without the fields that depend on timing."""
        return [{k: v for k, v in m.items() if k not in VOLATILE} for m in self.messages
                if m["type"] in ("partial", "final")]

    @property
    def error(self) -> dict[str, Any]:
        """The error message, which must be the last one the server sent."""
        assert self.messages and self.messages[-1]["type"] == "error", self.messages[-3:]
        assert len(self.of("error")) == 1
        return self.messages[-1]


async def _read(ws: ClientConnection, out: Outcome, t0: float) -> None:
    try:
        async for text in ws:
            out.messages.append(json.loads(text))
    except websockets.ConnectionClosed:
        pass
    out.close_code, out.close_reason = ws.close_code, ws.close_reason or ""
    out.seconds = time.monotonic() - t0


async def client(url: str, messages: list[str | bytes], pace_s: float = 0.0) -> Outcome:
    """Send `messages` in order, `pace_s` apart (as far as the server lets us), then read until
    the server closes."""
    out, t0 = Outcome(), time.monotonic()
    async with websockets.connect(url + "/v1/stream", max_size=None) as ws:
        reader = asyncio.create_task(_read(ws, out, t0))
        try:
            for m in messages:
                await ws.send(m)
                if pace_s:
                    await asyncio.sleep(pace_s)
        except websockets.ConnectionClosed:
            pass
        await reader
    assert [m["seq"] for m in out.messages] == list(range(len(out.messages)))
    return out


async def bystander(url: str, pcm: np.ndarray, live: asyncio.Event, release: asyncio.Event) -> Outcome:
    """A clean stream: start, the first half of `pcm`, then (`live` set) keepalives until `release`,
    the second half and `stop`. Its results must not depend on what happens meanwhile."""
    out, t0 = Outcome(), time.monotonic()
    data = pcm.tobytes()
    half = len(data) // 2 // PIECE * PIECE
    async with websockets.connect(url + "/v1/stream", max_size=None) as ws:
        await ws.send(json.dumps(START))
        out.messages.append(json.loads(await ws.recv()))
        assert out.messages[0]["type"] == "ready"
        reader = asyncio.create_task(_read(ws, out, t0))
        for i in range(0, half, PIECE):
            await ws.send(data[i: i + PIECE])
        live.set()
        while not release.is_set():
            await ws.send(KEEPALIVE)
            try:
                await asyncio.wait_for(release.wait(), 0.2)
            except TimeoutError:
                pass
        for i in range(half, len(data), PIECE):
            await ws.send(data[i: i + PIECE])
        await ws.send(STOP)
        await reader
    return out


async def clean_run(url: str, pcm: np.ndarray) -> Outcome:
    """`bystander` with nothing to wait for: the reference transcript."""
    done = asyncio.Event()
    done.set()
    return await bystander(url, pcm, asyncio.Event(), done)


async def settle(app: App, want: tuple[int, float, int], what: str, timeout: float = 5.0) -> None:
    """Wait until `load(app)` is `want`; fail naming `what` and the last load after `timeout` s."""
    deadline = time.monotonic() + timeout
    while (got := load(app)) != want:
        assert time.monotonic() < deadline, f"{what}: (slots, streams_active, tasks) = {got}, not {want}"
        await asyncio.sleep(0.02)


def streams_active(app: App) -> float | None:
    return app.state.metrics.registry.get_sample_value("streamd_streams_active")


def load(app: App) -> tuple[int, float | None, int]:
    """(engine slots in use, streams_active gauge, live connection tasks)."""
    return app.state.engine.recognizer.active, streams_active(app), len(app.state.live)


BadClient = Callable[[App, str], Coroutine[Any, Any, Outcome]]


def scenario(cfg: Config, bad: BadClient, bystanders_after: float | None = None) -> Outcome:
    """Run `bad` on a fresh daemon while two bystander streams are live mid-utterance.

    The bystanders connect first, unless `bystanders_after` is given: then they connect that many
    seconds after `bad` started. Checks that each bystander's results equal a clean run's, that a
    new stream afterwards gives them again, and that every slot and gauge is back to idle.
    Returns what the bad client saw.
    """
    async def main() -> Outcome:
        async with running(cfg) as (app, url):
            audio = [samples(SPEECH), samples(TONES)]
            reference = [await clean_run(url, pcm) for pcm in audio]
            assert all(r.of("final") and r.close_code == 1000 for r in reference)
            await settle(app, (0, 0, 0), "the reference streams were not released")

            lives, release = [asyncio.Event() for _ in audio], asyncio.Event()
            bad_task: asyncio.Task[Outcome] | None = None
            if bystanders_after is not None:
                bad_task = asyncio.create_task(bad(app, url))
                await asyncio.sleep(bystanders_after)
            tasks = [asyncio.create_task(bystander(url, pcm, live, release)) for pcm, live in zip(audio, lives)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in lives)), 10)
            bad_task = bad_task or asyncio.create_task(bad(app, url))
            outcome = await asyncio.wait_for(bad_task, 20)
            assert all(not t.done() for t in tasks), "a bystander ended before the bad client was done"
            release.set()
            for got, want in zip(await asyncio.gather(*tasks), reference):
                assert got.close_code == 1000 and got.messages[-1]["type"] == "summary"
                assert got.messages[-1]["reason"] == "stop"
                assert got.results == want.results

            assert (await clean_run(url, audio[0])).results == reference[0].results
            await settle(app, (0, 0, 0), "not released after the scenario")
            return outcome

    return asyncio.run(main())


def sends(*messages: str | bytes) -> BadClient:
    """A bad client that just sends `messages`."""
    async def run(app: App, url: str) -> Outcome:
        return await client(url, list(messages))
    return run


AUDIO = samples(SPEECH)[:16000].tobytes()  # one second

PROTOCOL_VIOLATIONS: dict[str, tuple[list[str | bytes], str, bool]] = {
    # case: (messages, words of the error message, whether `ready` came first)
    "malformed_json_first": (["{not json"], "not valid JSON", False),
    "malformed_json_midstream": ([start(), AUDIO, '{"type": "stop"'], "not valid JSON", True),
    "not_an_object": ([start(), AUDIO, "[1, 2]"], "must be a JSON object", True),
    "unknown_type": ([start(), AUDIO, '{"type": "pause"}'], 'unknown message type "pause"', True),
    "missing_type": ([start(), '{"sample_rate": 16000}'], "unknown message type null", True),
    "unknown_field_in_start": ([start(sample_rte=16000)], 'unknown field "sample_rte"', False),
    "unknown_field_in_control": ([start(), AUDIO, '{"type": "keepalive", "now": 1}'], 'unknown field "now"', True),
    "wrong_field_type": ([start(sample_rate="16000")], '"sample_rate" must be an integer', False),
    "audio_before_start": ([AUDIO, start()], 'audio before "start"', False),
    "control_before_start": ([KEEPALIVE], 'the first message must be "start"', False),
    "second_start": ([start(), AUDIO, start()], '"start" was already sent', True),
    "nested_1000_deep": ([start(), AUDIO, "[" * 1000 + "]" * 1000], "nested too deeply", True),
    "integer_of_5000_digits": (['{"type": "start", "sample_rate": ' + "9" * 5000 + "}"], "a number is too long", False),
    "megabyte_type": ([start(), AUDIO, json.dumps({"type": "x" * (1 << 19)})],
                      '"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', True),
}


@pytest.mark.parametrize("case", PROTOCOL_VIOLATIONS)
def test_protocol_violation_closes_1008(case: str) -> None:
    messages, words, ready = PROTOCOL_VIOLATIONS[case]
    out = scenario(config(), sends(*messages))
    assert out.error["code"] == "protocol_violation"
    assert words in out.error["message"]
    assert out.close_code == 1008 and out.close_reason  # the message, cut to the 123 bytes a close frame holds
    assert out.error["message"].encode()[:123].decode(errors="ignore") == out.close_reason
    assert len(out.error["message"]) < 300  # a client value is echoed cut short
    assert (out.messages[0]["type"] == "ready") is ready
    assert not out.of("summary")


@pytest.mark.parametrize(("late", "words"), [(AUDIO[:640], 'audio after "stop"'),
                                             (KEEPALIVE, '"keepalive" after the stream ended')],
                         ids=["audio", "keepalive"])
def test_anything_after_stop_is_a_protocol_violation(late: str | bytes, words: str) -> None:
    # Three seconds of audio in one message: the server is still decoding it when `late` arrives.
    out = scenario(config(), sends(start(), samples(SPEECH).tobytes(), STOP, late))
    assert out.error["code"] == "protocol_violation" and out.error["message"] == words
    assert out.close_code == 1008 and not out.of("summary")


UNSUPPORTED_FORMATS: dict[str, tuple[str, str]] = {
    "7_khz": (start(sample_rate=7000), "sample_rate 7000"),
    "96_khz": (start(sample_rate=96000), "sample_rate 96000"),
    "48001_hz": (start(sample_rate=48001), "sample_rate 48001"),
    "mulaw": (start(encoding="mulaw"), 'encoding "mulaw"'),
    "9_channels": (start(channels=9), "channels 9"),
}


@pytest.mark.parametrize("case", UNSUPPORTED_FORMATS)
def test_unsupported_format_closes_1003(case: str) -> None:
    message, words = UNSUPPORTED_FORMATS[case]
    out = scenario(config(), sends(message, AUDIO))
    assert out.error["code"] == "unsupported_audio" and words in out.error["message"]
    assert out.close_code == 1003
    assert out.seconds < 3  # at once, though audio followed the `start` (not after websockets' 10-s close timeout)
    assert len(out.messages) == 1  # no `ready`


@pytest.mark.parametrize("bad_value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_f32le_sample_closes_1003(bad_value: float) -> None:
    audio = samples(SPEECH)[:16000].astype("<f4") / 32768
    audio[12345] = bad_value
    out = scenario(config(), sends(start(encoding="f32le"), audio[:8000].tobytes(), audio[8000:].tobytes()))
    assert out.messages[0]["type"] == "ready"
    assert out.error["code"] == "unsupported_audio"
    assert "NaN or infinite sample at frame 12345" in out.error["message"]
    assert out.close_code == 1003


def test_message_over_max_message_bytes_closes_1009() -> None:
    limit = 4096
    audio = samples(SPEECH).tobytes()

    async def bad(app: App, url: str) -> Outcome:
        out, t0 = Outcome(), time.monotonic()
        async with websockets.connect(url + "/v1/stream", max_size=None) as ws:
            await ws.send(start())
            out.messages.append(json.loads(await ws.recv()))
            for i in range(0, 16 * limit, limit):  # messages of exactly the limit are fine...
                await ws.send(audio[i: i + limit])
            while not out.of("partial"):  # ...and decoded
                out.messages.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            await ws.send(audio[16 * limit: 17 * limit + 1])
            await _read(ws, out, t0)
        # Too big right after `start`, possibly before the server has sent `ready`.
        at_once = await client(url, [start(), audio[: limit + 1]])
        assert at_once.close_code == 1009 and not at_once.of("summary")
        return out

    out = scenario(config(max_message_bytes=limit), bad)
    assert out.messages[0]["type"] == "ready"
    assert out.close_code == 1009
    assert all(m["code"] == "message_too_big" for m in out.of("error"))  # the error message is optional
    assert not out.of("summary")


def test_idle_timeout_closes_1008_and_keepalive_resets_it() -> None:
    idle = 1.0

    async def bad(app: App, url: str) -> Outcome:
        silent_after_start, silent_before_start, kept_alive = await asyncio.gather(
            client(url, [start(), AUDIO]),
            client(url, []),
            client(url, [start(), AUDIO, *[KEEPALIVE] * 6, STOP], pace_s=0.3))
        assert silent_before_start.error["code"] == "idle_timeout" and silent_before_start.close_code == 1008
        assert idle <= silent_before_start.seconds < idle + 1
        assert kept_alive.seconds > 2 * idle
        assert kept_alive.close_code == 1000 and kept_alive.messages[-1]["reason"] == "stop"
        return silent_after_start

    out = scenario(config(idle_timeout_s=idle), bad)
    assert out.messages[0]["type"] == "ready"
    assert out.error["code"] == "idle_timeout" and out.close_code == 1008
    assert idle <= out.seconds < idle + 1


def test_max_session_closes_1008_while_streaming_or_silent() -> None:
    limit = 3.0
    pieces = [AUDIO[i: i + PIECE] for i in range(0, len(AUDIO), PIECE)] * 8  # 8 s at real time

    async def bad(app: App, url: str) -> Outcome:
        streaming, silent = await asyncio.gather(client(url, [start(), *pieces, STOP], pace_s=0.1),
                                                 client(url, [start()]))
        assert silent.error["code"] == "session_expired" and silent.close_code == 1008
        assert limit <= silent.seconds < limit + 1  # well before idle_timeout_s
        return streaming

    # The bystanders join later, so that they end well within their own max_session_s.
    out = scenario(config(max_session_s=limit, idle_timeout_s=10.0), bad, bystanders_after=1.5)
    assert out.of("partial")  # it was decoding until then
    assert out.error["code"] == "session_expired" and out.close_code == 1008
    assert limit <= out.seconds < limit + 1


def test_client_vanishing_mid_stream_releases_its_slot() -> None:
    async def bad(app: App, url: str) -> Outcome:
        out = Outcome()
        ws = await websockets.connect(url + "/v1/stream")
        await ws.send(start())
        await ws.send(samples(SPEECH)[:32000].tobytes())
        while not out.of("partial"):  # mid-utterance
            out.messages.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        assert load(app) == (3, 3, 3)
        ws.transport.abort()  # TCP drop, no close frame
        await settle(app, (2, 2, 2), "the vanished stream was not released")
        return out

    scenario(config(), bad)


def split(data: bytes, rng: np.random.Generator, modulus: int, residues: tuple[int, ...]) -> list[bytes]:
    """Cut `data` into messages of 1..8 KiB whose sizes are `residues` modulo `modulus`."""
    out, i = [], 0
    while i < len(data):
        k = int(rng.integers(0, 8192 // modulus)) * modulus + int(rng.choice(residues))
        out.append(data[i: i + k])
        i += k
    return out


def test_odd_byte_splits_give_the_same_transcript_as_even_splits() -> None:
    pcm = samples(SPEECH)
    s16 = pcm.tobytes()
    f32 = (pcm / 32768).astype("<f4").tobytes()  # exactly the samples s16le decodes to
    stereo = np.repeat(pcm, 2).tobytes()  # both channels equal: their mean is the mono signal

    async def bad(app: App, url: str) -> Outcome:
        rng = np.random.default_rng(7)
        even = await client(url, [start(), *split(s16, rng, 2, (2,)), STOP])
        others = await asyncio.gather(
            client(url, [start(), *split(s16, rng, 2, (1,)), STOP]),
            client(url, [start(encoding="f32le"), *split(f32, rng, 4, (1, 2, 3)), STOP]),
            client(url, [start(channels=2), *split(stereo, rng, 4, (1, 2, 3)), STOP]))
        assert even.close_code == 1000 and even.of("final")
        for other in others:
            assert other.close_code == 1000 and other.messages[-1]["type"] == "summary"
            assert other.results == even.results
        return even

    scenario(config(), bad)


@pytest.mark.parametrize("rate", [8000, 44100, 48000])
def test_other_sample_rates_are_resampled(rate: int) -> None:
    pcm = samples(SPEECH)
    audio = np.clip(np.round(soxr.resample(pcm.astype(np.float32), 16000, rate, "HQ")), -32768, 32767).astype("<i2")
    pieces = [audio[i: i + rate // 10].tobytes() for i in range(0, len(audio), rate // 10)]
    out = scenario(config(), sends(start(sample_rate=rate), *pieces, STOP))
    assert out.messages[0]["sample_rate"] == rate
    assert out.close_code == 1000 and out.messages[-1]["reason"] == "stop"
    assert abs(out.messages[-1]["audio_seconds"] - len(pcm) / 16000) < 0.01
    assert any(f["text"] for f in out.of("final"))
