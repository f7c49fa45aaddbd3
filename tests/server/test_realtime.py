"""The OpenAI Realtime transcription endpoint (`/v1/realtime`) against a real daemon: every event type
with a plain websocket client, transcripts equal to the native protocol's for the same audio, bad
events answered with `error` events that leave every stream untouched, shared limits, and the real
`openai` SDK (GA and beta clients) transcribing espeak-ng speech with the shipped default model."""
from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import soxr
import websockets
from websockets.asyncio.client import ClientConnection

from conftest import FIXTURES
from daemon import config, running, stream_pcm
from streamd.server.realtime import G711

SPEECH = FIXTURES / "in3_espeak_sentence.wav"
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
STARTED, STOPPED = "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"
COMMITTED = "input_audio_buffer.committed"
PIECE_S = 0.1  # audio per append


def speech(rate: int = 16000, gap_s: float = 1.5) -> np.ndarray:
    """The espeak fixture twice with a pause: int16 at `rate`."""
    pcm, fixture_rate = sf.read(str(SPEECH), dtype="int16")
    audio = np.concatenate([pcm, np.zeros(int(fixture_rate * gap_s), np.int16), pcm])
    if rate != fixture_rate:
        audio = np.round(soxr.resample(audio.astype(np.float32), fixture_rate, rate)).astype(np.int16)
    return audio


def s16(audio: np.ndarray) -> bytes:
    return np.asarray(audio, dtype="<i2").tobytes()


def g711_encode(audio: np.ndarray, law: str) -> bytes:
    """The nearest G.711 code of each sample (the test's encoder; the server only decodes)."""
    table = G711[law].astype(np.int32)
    order = np.argsort(table)
    idx = np.clip(np.searchsorted(table[order], audio), 1, 255)
    lower, upper = order[idx - 1], order[idx]
    nearer = np.where(np.abs(table[lower] - audio) <= np.abs(table[upper] - audio), lower, upper)
    return nearer.astype(np.uint8).tobytes()


def pieces(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


class EventClient:
    """A plain websocket client that keeps every JSON message the server sends (`events`)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.close_code: int | None = None
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for text in self.ws:
                self.events.append(json.loads(text))
                self._changed.set()
        except websockets.ConnectionClosed:
            pass
        self.close_code = self.ws.close_code
        self._changed.set()

    async def send(self, kind: str, **fields: Any) -> None:
        await self.ws.send(json.dumps({"type": kind, **fields}))

    async def wait(self, kind: str, total: int = 1, timeout: float = 60, **match: Any) -> dict[str, Any]:
        """The `total`-th event of `kind` (with the fields in `match`) on this connection, once it has come."""
        async with asyncio.timeout(timeout):
            while len(self.of(kind, **match)) < total:
                assert not self._reader.done(), f"closed waiting for {kind}: {self.events[-3:]}"
                await self._changed.wait()
                self._changed.clear()
        return self.of(kind, **match)[total - 1]

    async def closed(self) -> int | None:
        await self._reader
        return self.close_code

    def of(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind and all(e.get(k) == v for k, v in match.items())]


class Client(EventClient):
    """A plain websocket client of /v1/realtime."""

    async def append(self, data: bytes, piece: int) -> None:
        for chunk in pieces(data, piece):
            await self.send("input_audio_buffer.append", audio=base64.b64encode(chunk).decode())

    def item_events(self, item: str) -> list[str]:
        return [e["type"] for e in self.events if e.get("item_id") == item]


async def connect(url: str, beta: bool = False, query: str = "?intent=transcription") -> Client:
    headers = {"OpenAI-Beta": "realtime=v1"} if beta else {}
    ws = await websockets.connect(url + "/v1/realtime" + query, additional_headers=headers, max_size=None)
    return Client(ws)


def ga_session(fmt: dict[str, Any], turn: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    audio_in: dict[str, Any] = {"format": fmt, "turn_detection": turn, **extra}
    return {"type": "transcription", "audio": {"input": audio_in}}


async def native_finals(url: str, audio: bytes, rate: int, endpointing: bool = True,
                        finalize_at: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """The native protocol's finals for the same audio, with `finalize` after each byte offset given."""
    cuts = [0, *finalize_at, len(audio)]
    async with websockets.connect(url + "/v1/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": rate, "encoding": "s16le",
                                  "endpointing": endpointing}))
        for i in range(len(cuts) - 1):
            for chunk in pieces(audio[cuts[i]:cuts[i + 1]], 6400):
                await ws.send(chunk)
            await ws.send(json.dumps({"type": "finalize" if i < len(cuts) - 2 else "stop"}))
        messages = [json.loads(m) async for m in ws]
    return [m for m in messages if m["type"] == "final"]


def test_g711_tables_match_sox(tmp_path: Path) -> None:
    for law, sox_name in (("g711_ulaw", "u-law"), ("g711_alaw", "a-law")):
        table = G711[law]
        # ITU-T G.711 anchors: silence codes and the extremes.
        if law == "g711_ulaw":
            assert (table[0xFF], table[0x7F], table[0x00], table[0x80]) == (0, 0, -32124, 32124)
        else:
            assert (table[0xD5], table[0x55], table[0xAA], table[0x2A]) == (8, -8, 32256, -32256)
        if shutil.which("sox") is None:
            continue
        codes, out = tmp_path / f"{law}.raw", tmp_path / f"{law}.s16"
        codes.write_bytes(bytes(range(256)))
        subprocess.run(["sox", "-t", "raw", "-r", "8000", "-e", sox_name, "-b", "8", "-c", "1", str(codes),
                        "-t", "raw", "-e", "signed", "-b", "16", "-L", str(out)], check=True)
        assert np.array_equal(np.frombuffer(out.read_bytes(), "<i2"), table)


def test_session_created_and_updated_in_both_dialects() -> None:
    async def main() -> None:
        async with running(config()) as (_, url):
            ga = await connect(url)
            created = await ga.wait("session.created")
            session = created["session"]
            assert session["type"] == "transcription" and session["id"].startswith("sess_")
            assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
            assert session["audio"]["input"]["turn_detection"] == {"type": "server_vad", "silence_duration_ms": 800}
            # Ignored settings are accepted; the echo shows the effective configuration.
            await ga.send("session.update", event_id="u1", session=ga_session(
                {"type": "audio/pcm", "rate": 16000}, {"type": "server_vad", "silence_duration_ms": 480,
                                                       "threshold": 0.7, "prefix_padding_ms": 300},
                noise_reduction={"type": "near_field"}, transcription={"model": "gpt-4o-transcribe", "language": "en"}))
            updated = (await ga.wait("session.updated"))["session"]["audio"]["input"]
            assert updated == {"format": {"type": "audio/pcm", "rate": 16000},
                               "transcription": {"model": "tiny_streaming_fastconformer_rnnt"},
                               "turn_detection": {"type": "server_vad", "silence_duration_ms": 480},
                               "noise_reduction": None}
            await ga.send("session.update", session={"type": "transcription",
                                                     "audio": {"input": {"format": {"type": "audio/pcmu"}}}})
            updated = (await ga.wait("session.updated", 2))["session"]["audio"]["input"]
            assert updated["format"] == {"type": "audio/pcmu"} and updated["turn_detection"]["silence_duration_ms"] == 480

            beta = await connect(url, beta=True)
            created = await beta.wait("transcription_session.created")
            assert created["session"]["input_audio_format"] == "pcm16"
            await beta.send("transcription_session.update", session={
                "input_audio_format": "g711_alaw", "turn_detection": None,
                "input_audio_transcription": {"model": "gpt-4o-mini-transcribe"}})
            updated = (await beta.wait("transcription_session.updated"))["session"]
            assert updated["input_audio_format"] == "g711_alaw" and updated["turn_detection"] is None
            assert updated["object"] == "realtime.transcription_session"

            other = await connect(url, query="?intent=conversation")
            assert (await other.wait("error"))["error"]["code"] == "unsupported"
            assert await other.closed() == 1008
            for client in (ga, beta):
                await client.ws.close()
    asyncio.run(main())


def test_server_vad_events_and_transcripts_equal_the_native_protocol() -> None:
    audio = s16(speech())

    async def main() -> tuple[Client, list[dict[str, Any]]]:
        async with running(config()) as (_, url):
            native = await native_finals(url, audio, 16000)
            client = await connect(url)
            await client.send("session.update", session=ga_session({"type": "audio/pcm", "rate": 16000},
                                                                   {"type": "server_vad"}))
            await client.wait("session.updated")
            await client.append(audio, int(16000 * 2 * PIECE_S))
            await client.send("input_audio_buffer.commit")
            await client.wait(COMPLETED, len(native))
            await client.ws.close()
        return client, native

    client, native = asyncio.run(main())
    completed = client.of(COMPLETED)
    assert [c["transcript"] for c in completed] == [f["text"] for f in native]
    assert len(native) >= 3 and [f["reason"] for f in native][:2] == ["endpoint", "endpoint"]
    previous = None
    for c, f in zip(completed, native):
        item = c["item_id"]
        kinds = client.item_events(item)
        deltas = [e["delta"] for e in client.events if e["type"] == DELTA and e["item_id"] == item]
        assert "".join(deltas) == c["transcript"], "deltas append up to the final text"
        assert kinds[0] == STARTED and kinds[-1] == COMPLETED
        assert kinds[-2 - (kinds[-2] == DELTA)] == COMMITTED
        committed = next(e for e in client.of(COMMITTED) if e["item_id"] == item)
        assert committed["previous_item_id"] == previous
        previous = item
        started = next(e for e in client.of(STARTED) if e["item_id"] == item)
        assert started["audio_start_ms"] == round(f["start"] * 1000)
        assert c["usage"] == {"type": "duration", "seconds": round(f["end"] - f["start"], 3)}
        if f["reason"] == "endpoint":  # server VAD commits after speech_stopped
            stopped = next(e for e in client.of(STOPPED) if e["item_id"] == item)
            assert stopped["audio_end_ms"] == round(f["end"] * 1000)
            assert kinds.index(STOPPED) < kinds.index(COMMITTED)
        else:  # the client's commit: no speech_stopped
            assert STOPPED not in kinds
    assert len({e["event_id"] for e in client.events}) == len(client.events)


def test_manual_commit_and_clear() -> None:
    pcm = speech(gap_s=0.0)
    a, b, c = (s16(pcm[i * len(pcm) // 3:(i + 1) * len(pcm) // 3]) for i in range(3))

    async def main() -> tuple[Client, list[dict[str, Any]]]:
        async with running(config()) as (_, url):
            native = await native_finals(url, a + c, 16000, endpointing=False, finalize_at=(len(a),))
            client = await connect(url)
            await client.send("session.update", session=ga_session({"type": "audio/pcm", "rate": 16000}, None))
            await client.wait("session.updated")
            await client.send("input_audio_buffer.clear", event_id="clear-empty")
            await client.wait("input_audio_buffer.cleared")
            await client.append(a, 3200)
            await client.send("input_audio_buffer.commit", event_id="c1")
            await client.wait(COMPLETED)
            await client.append(b, 3200)
            await client.send("input_audio_buffer.clear", event_id="clear-b")
            await client.wait("input_audio_buffer.cleared", 2)
            await client.append(c, 3200)
            await client.send("input_audio_buffer.commit", event_id="c2")
            await client.send("input_audio_buffer.commit", event_id="c3")
            error = await client.wait("error")
            await client.wait(COMPLETED, 2)
            await client.ws.close()
        assert error["error"] == {"type": "invalid_request_error", "code": "input_audio_buffer_commit_empty",
                                  "message": "no audio was appended since the last commit or clear",
                                  "param": None, "event_id": "c3"}
        return client, native

    client, native = asyncio.run(main())
    # The cleared audio (b) leaves no trace: the second item is c alone, as after a native finalize.
    assert [c["transcript"] for c in client.of(COMPLETED)] == [f["text"] for f in native]
    assert [f["reason"] for f in native] == ["finalize", "end_of_stream"]
    assert not client.of(STARTED) and not client.of(STOPPED), "no VAD events with turn_detection null"
    first, second = client.of(COMMITTED)
    assert second["previous_item_id"] == first["item_id"]
    assert len(client.of("input_audio_buffer.cleared")) == 2


def test_g711_transcribes_like_native_8khz() -> None:
    pcm8k = speech(8000, gap_s=0.0)

    async def main() -> None:
        async with running(config()) as (_, url):
            for law, session in (("g711_ulaw", ("session.update", ga_session({"type": "audio/pcmu"}, None))),
                                 ("g711_alaw", ("transcription_session.update",
                                                {"input_audio_format": "g711_alaw", "turn_detection": None}))):
                codes = g711_encode(pcm8k, law)
                decoded = G711[law][np.frombuffer(codes, np.uint8)]
                # A commit is a native finalize (the resampler's last few ms go to the next item).
                native = await native_finals(url, s16(decoded), 8000, endpointing=False,
                                             finalize_at=(2 * len(decoded),))
                client = await connect(url, beta=session[0].startswith("transcription"))
                await client.send(session[0], session=session[1])
                await client.wait(session[0] + "d")
                await client.append(codes, 800)
                await client.send("input_audio_buffer.commit")
                completed = await client.wait(COMPLETED)
                await client.ws.close()
                assert completed["transcript"] == native[0]["text"] and native[0]["text"], law
    asyncio.run(main())


# Each bad event: what it is, and the error code and param it must get.
BAD_EVENTS: list[tuple[str | bytes, str, str | None]] = [
    ("{not json", "invalid_event", None),
    (b"\x00\x01binary audio", "invalid_event", None),
    ('["input_audio_buffer.append"]', "invalid_event", None),
    ("[" * 100_000 + "]" * 100_000, "invalid_event", None),
    ('{"type": "input_audio_buffer.clear", "n": ' + "9" * 5000 + "}", "invalid_event", None),
    (json.dumps({"type": "input_audio_buffer.appendd", "event_id": "e1"}), "unknown_event", "type"),
    (json.dumps({"type": "response.create", "event_id": "e2"}), "unsupported", "type"),
    (json.dumps({"type": "conversation.item.create", "event_id": "e3", "item": {}}), "unsupported", "type"),
    (json.dumps({"type": "input_audio_buffer.append", "event_id": "e4", "audio": "not base64!"}),
     "invalid_base64", "audio"),
    (json.dumps({"type": "input_audio_buffer.append", "event_id": "e5", "audio": "AAA"}), "invalid_base64", "audio"),
    (json.dumps({"type": "input_audio_buffer.append", "event_id": "e6"}), "missing_required_parameter", "audio"),
    (json.dumps({"type": "input_audio_buffer.append", "event_id": "e7", "audio": 12}), "invalid_type", "audio"),
    (json.dumps({"type": "input_audio_buffer.commit", "event_id": "e8", "final": True}), "unknown_parameter", "final"),
    (json.dumps({"type": "input_audio_buffer.clear", "event_id": 9}), "invalid_type", "event_id"),
    (json.dumps({"type": "session.update", "event_id": "e10", "session": ga_session({"type": "audio/mp3"})}),
     "invalid_value", "session.audio.input.format.type"),
    (json.dumps({"type": "session.update", "event_id": "e11",
                 "session": ga_session({"type": "audio/pcm", "rate": 96000})}),
     "invalid_value", "session.audio.input.format.rate"),
    (json.dumps({"type": "transcription_session.update", "event_id": "e12",
                 "session": {"input_audio_format": "opus"}}), "invalid_value", "session.input_audio_format"),
    (json.dumps({"type": "session.update", "event_id": "e13",
                 "session": ga_session({"type": "audio/pcm"}, {"type": "semantic_vad"})}),
     "unsupported", "session.audio.input.turn_detection.type"),
    (json.dumps({"type": "session.update", "event_id": "e14",
                 "session": {"type": "transcription", "include": ["item.input_audio_transcription.logprobs"]}}),
     "unsupported", "session.include"),
    (json.dumps({"type": "session.update", "event_id": "e15", "session": {"type": "realtime"}}),
     "unsupported", "session.type"),
    (json.dumps({"type": "session.update", "event_id": "e16", "session": {"type": "transcription", "voice": "x"}}),
     "unknown_parameter", "session.voice"),
    (json.dumps({"type": "session.update", "event_id": "e17",
                 "session": ga_session({"type": "audio/pcm", "rate": 16000}, {"type": "server_vad",
                                                                               "silence_duration_ms": 0})}),
     "invalid_value", "session.audio.input.turn_detection.silence_duration_ms"),
    (json.dumps({"type": "session.update", "event_id": "e18"}), "missing_required_parameter", "session"),
    # Valid, but the format cannot change once audio was appended.
    (json.dumps({"type": "session.update", "event_id": "e19", "session": ga_session({"type": "audio/pcma"})}),
     "session_update_after_audio", "session"),
    # A list or an object where a format name is expected.
    (json.dumps({"type": "transcription_session.update", "event_id": "e20", "session": {"input_audio_format": ["pcm16"]}}),
     "invalid_value", "session.input_audio_format"),
    (json.dumps({"type": "transcription_session.update", "event_id": "e21",
                 "session": {"input_audio_format": {"type": "pcm16"}}}), "invalid_value", "session.input_audio_format"),
    (json.dumps({"type": "session.update", "event_id": "e22", "session": ga_session({"type": ["audio/pcm"]})}),
     "invalid_value", "session.audio.input.format.type"),
    (json.dumps({"type": "session.update", "event_id": "e23", "session": ga_session({"type": {"a": 1}})}),
     "invalid_value", "session.audio.input.format.type"),
    # An event_id too long to echo.
    (json.dumps({"type": "input_audio_buffer.clear", "event_id": "x" * 200_000}), "invalid_value", "event_id"),
]


def test_bad_events_get_errors_and_leave_every_stream_untouched() -> None:
    audio = s16(speech())
    half = len(audio) // 2 // 3200 * 3200
    update = ga_session({"type": "audio/pcm", "rate": 16000}, {"type": "server_vad"})

    async def realtime_run(url: str, items: int, bad: bool = False) -> Client:
        client = await connect(url)
        await client.send("session.update", session=update)
        await client.wait("session.updated")
        await client.append(audio[:half], 3200)
        sent = half
        for i, (event, code, param) in enumerate(BAD_EVENTS if bad else []):
            await client.ws.send(event)
            error = (await client.wait("error", i + 1))["error"]
            assert (error["code"], error["param"]) == (code, param), (event, error)
            assert error["type"] == "invalid_request_error" and error["message"]
            try:
                event_id = json.loads(event)["event_id"]
            except (ValueError, TypeError, KeyError, RecursionError):
                event_id = None
            assert error["event_id"] == (event_id if isinstance(event_id, str) and len(event_id) < 1000 else None)
            assert len(error["message"]) < 500
            if i % 4 == 0:  # good audio between the bad events
                await client.append(audio[sent:sent + 3200], 3200)
                sent += 3200
        await client.append(audio[sent:], 3200)
        await client.send("input_audio_buffer.commit")
        await client.wait(COMPLETED, items)
        await client.ws.close()
        return client

    async def main() -> tuple[Client, Client, Client, Any]:
        async with running(config()) as (_, url):
            items = len(await native_finals(url, audio, 16000))
            clean = await realtime_run(url, items)
            bad, bystander, native = await asyncio.gather(
                realtime_run(url, items, bad=True), realtime_run(url, items),
                stream_pcm(url, audio, np.random.default_rng(1),
                           {"type": "start", "sample_rate": 16000, "encoding": "s16le"}))
        return clean, bad, bystander, native

    clean, bad, bystander, native = asyncio.run(main())
    expected = [c["transcript"] for c in clean.of(COMPLETED)]
    assert expected == [f["text"] for f in native.of("final")]
    assert [c["transcript"] for c in bad.of(COMPLETED)] == expected, "bad events lose no audio"
    assert [c["transcript"] for c in bystander.of(COMPLETED)] == expected
    assert len(bad.of("error")) == len(BAD_EVENTS) and not bystander.of("error")


def test_limits_and_shutdown_are_shared_with_the_native_protocol() -> None:
    audio = s16(speech(gap_s=0.0))

    async def no_streams(app: Any) -> None:
        async with asyncio.timeout(10):
            while app.state.live:
                await asyncio.sleep(0.05)

    async def main() -> None:
        async with running(config(max_streams=1, idle_timeout_s=2.0)) as (app, url):
            native = await websockets.connect(url + "/v1/stream")
            with pytest.raises(websockets.InvalidStatus) as refused:
                await connect(url)
            assert refused.value.response.status_code == 503
            await native.close()
            await no_streams(app)
            idle = await connect(url)
            error = await idle.wait("error", timeout=10)
            assert error["error"]["code"] == "idle_timeout" and await idle.closed() == 1008
            await no_streams(app)
            # Shutdown: audio not yet committed is transcribed, then the close says "going away".
            client = await connect(url)
            await client.send("session.update", session=ga_session({"type": "audio/pcm", "rate": 16000}, None))
            await client.append(audio, 3200)
            await client.wait(DELTA)
            app.state.shutdown.set()
            completed = await client.wait(COMPLETED)
            assert completed["transcript"] and await client.closed() == 1001
            assert [e["type"] for e in client.events if e["type"] != DELTA][-2:] == [COMMITTED, COMPLETED]
            assert "".join(e["delta"] for e in client.of(DELTA)) == completed["transcript"]
    asyncio.run(main())


def test_commit_and_clear_work_with_the_daemon_full() -> None:
    audio = s16(speech(gap_s=0.0))
    third = len(audio) // 3 // 2 * 2

    async def committer(url: str) -> Client:
        client = await connect(url)
        await client.send("session.update", session=ga_session({"type": "audio/pcm", "rate": 16000}, None))
        for i, end_item in enumerate(("input_audio_buffer.commit", "input_audio_buffer.clear",
                                      "input_audio_buffer.commit")):
            await client.append(audio[i * third:(i + 1) * third], 6400)
            await client.send(end_item)
        await client.wait(COMPLETED, 2)
        await client.ws.close()
        return client

    async def main() -> None:
        async with running(config(max_streams=2)) as (app, url):  # every slot taken
            for client in await asyncio.gather(committer(url), committer(url)):
                assert not client.of("error"), client.of("error")
            async with asyncio.timeout(10):  # the clients closed: their slots are released
                while app.state.live or app.state.engine.recognizer.active:
                    await asyncio.sleep(0.05)
    asyncio.run(main())


def test_backlog_paces_or_closes_like_the_native_protocol() -> None:
    audio = s16(speech())
    manual = ga_session({"type": "audio/pcm", "rate": 16000}, None)

    async def flood(url: str) -> Client:
        client = await connect(url)
        await client.send("session.update", session=manual)
        await client.append(audio, len(audio))  # 9.7 s in one event
        await client.send("input_audio_buffer.commit")
        return client

    async def main() -> None:
        async with running(config(max_backlog_s=4.0)) as (app, url):  # pace: lossless
            native = await native_finals(url, audio, 16000, endpointing=False)
            client = await flood(url)
            completed = await client.wait(COMPLETED)
            await client.ws.close()
            assert completed["transcript"] == native[0]["text"]
            paced = app.state.metrics.registry.get_sample_value("streamd_backlog_events_total", {"action": "paced"})
            assert paced is not None and paced >= 2, "both faces were paced"
        async with running(config(max_backlog_s=4.0, backlog_policy="close")) as (_, url):
            client = await flood(url)
            error = await client.wait("error")
            assert error["error"]["code"] == "backlog_exceeded" and await client.closed() == 1008
    asyncio.run(main())


# -- the openai SDK, with the shipped default model and espeak-ng speech ---------------------------

SENTENCES = ["please call me back in ten minutes", "open the door and turn on the light"]


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng (.ci/run installs it)")
def test_openai_sdk_transcribes_speech_like_the_native_protocol(tmp_path: Path) -> None:
    from openai import AsyncOpenAI

    from recipes.wer import wer
    from test_default_model import speak

    said = [np.frombuffer(speak(s, tmp_path / f"{i}.wav"), "<i2") for i, s in enumerate(SENTENCES)]
    pause = np.zeros(22050 * 3 // 2, np.int16)
    at22k = np.concatenate([said[0], pause, said[1], pause])
    audio = s16(np.round(soxr.resample(at22k.astype(np.float32), 22050, 24000)))  # the spec's rate

    async def sdk_run(client: AsyncOpenAI, beta: bool) -> list[str]:
        manager: Any = (client.beta.realtime.connect(model="gpt-4o-transcribe", extra_query={"intent": "transcription"})
                        if beta else client.realtime.connect(extra_query={"intent": "transcription"}))
        async with manager as conn:
            created = await conn.recv()
            assert created.type == ("transcription_session.created" if beta else "session.created")
            if beta:
                await conn.transcription_session.update(session={"input_audio_format": "pcm16",
                                                                 "turn_detection": {"type": "server_vad"}})
            else:
                await conn.session.update(session={"type": "transcription", "audio": {"input": {
                    "format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": {"type": "server_vad"}}}})
            for chunk in pieces(audio, int(24000 * 2 * PIECE_S)):
                await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
            texts: list[str] = []
            async for event in conn:
                assert event.type != "error", event
                if event.type == COMPLETED:
                    texts.append(event.transcript)
                    if len(texts) == len(SENTENCES):
                        return texts
        raise AssertionError("connection closed before the transcripts")

    async def main() -> tuple[list[str], list[str], list[dict[str, Any]]]:
        async with running(config(model=None)) as (_, url):
            client = AsyncOpenAI(api_key="unused", websocket_base_url=url + "/v1")
            ga, beta, native = await asyncio.gather(sdk_run(client, False), sdk_run(client, True),
                                                    native_finals(url, audio, 24000))
        return ga, beta, native

    ga, beta, native = asyncio.run(main())
    expected = [f["text"] for f in native if f["text"]]
    print(list(zip(SENTENCES, ga)))
    assert ga == beta == expected
    assert wer(zip(SENTENCES, ga)) <= 35.0, list(zip(SENTENCES, ga))
