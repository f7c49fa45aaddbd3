"""Deepgram's live protocol (`/v1/listen`) against a real daemon: every message type with a plain
websocket client, transcripts equal to the native protocol's for the same audio, bad parameters
refused at the handshake and bad messages answered with non-fatal `Error` messages that leave every
stream untouched, shared limits, and the official `deepgram-sdk` live client."""
from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websockets

from daemon import config, running, stream_pcm
from streamd.server.deepgram import parse_options
from streamd.server.realtime import G711
from test_realtime import EventClient, g711_encode, native_finals, pieces, s16, speech

PIECE = 3200  # bytes of 16 kHz linear16 per message: 100 ms
TOKEN = "dg-secret-key-123"


class Client(EventClient):
    """A plain websocket client of /v1/listen (its server messages in `events`)."""

    async def audio(self, data: bytes, piece: int = PIECE) -> None:
        for chunk in pieces(data, piece):
            await self.ws.send(chunk)

    def finals(self) -> list[dict[str, Any]]:
        return self.of("Results", is_final=True)


def transcript(result: dict[str, Any]) -> str:
    return str(result["channel"]["alternatives"][0]["transcript"])


async def connect(url: str, query: str = "encoding=linear16&sample_rate=16000", **kw: Any) -> Client:
    return Client(await websockets.connect(f"{url}/v1/listen?{query}", max_size=None, **kw))


def test_results_speech_events_and_metadata_like_the_native_protocol() -> None:
    audio = s16(speech())

    async def main() -> tuple[Client, list[dict[str, Any]]]:
        async with running(config()) as (_, url):
            native = (await stream_pcm(url, audio, np.random.default_rng(0))).of("final")  # with word times
            client = await connect(url, "encoding=linear16&sample_rate=16000&interim_results=true&vad_events=true"
                                   "&utterance_end_ms=1000&model=nova-3&language=en-US&extra=team:voice")
            await client.audio(audio)
            await client.send("CloseStream")
            assert await client.closed() == 1000
        return client, native

    client, native = asyncio.run(main())
    finals = client.finals()
    assert [transcript(f) for f in finals] == [f["text"] for f in native]
    assert len(native) >= 3 and [f["reason"] for f in native][:2] == ["endpoint", "endpoint"]
    assert [f["speech_final"] for f in finals] == [f["reason"] == "endpoint" for f in native]
    assert not any(f["from_finalize"] for f in finals)
    for f, n in zip(finals, native):
        assert (f["start"], f["duration"]) == (round(n["start"], 3), round(n["end"] - n["start"], 3))
        words = f["channel"]["alternatives"][0]["words"]
        assert [w["word"] for w in words] == [w["word"] for w in n["words"]]
        assert [(w["start"], w["end"]) for w in words] == [(w["start"], w["end"]) for w in n["words"]]
        assert all(w["confidence"] == 1.0 and w["punctuated_word"] == w["word"] for w in words)
    interim = client.of("Results", is_final=False)
    assert interim and all(not r["speech_final"] and r["channel"]["alternatives"][0]["words"] for r in interim
                           if transcript(r))
    assert all(r["channel_index"] == [0, 1] for r in client.of("Results"))
    metadata = {json.dumps(r["metadata"], sort_keys=True) for r in client.of("Results")}
    assert len(metadata) == 1 and client.of("Results")[0]["metadata"]["extra"] == {"team": "voice"}
    # SpeechStarted comes once per spoken utterance, before its first Results, at its first word.
    kinds = [m["type"] for m in client.events]
    started = client.of("SpeechStarted")
    assert len(started) == len([n for n in native if n["text"]])
    assert kinds.index("SpeechStarted") < kinds.index("Results")
    assert [s["timestamp"] for s in started] == [n["words"][0]["start"] for n in native if n["text"]]
    # UtteranceEnd after each word followed by 1 s without words (in the audio: the tiny model's
    # 1120 ms steps may hold the pause and the next words), before the next words' Results.
    words = [w for n in native for w in n["words"]]
    gaps = [(a["end"], b["start"] - a["end"]) for a, b in zip(words, words[1:])]
    ends = [e["last_word_end"] for e in client.of("UtteranceEnd")]
    assert ends == [end for end, gap in gaps if gap >= 1.0] and len(ends) >= 2
    for end in ends:
        at = client.events.index(next(e for e in client.of("UtteranceEnd") if e["last_word_end"] == end))
        later = [w["start"] for m in client.events[at:] if m["type"] == "Results"
                 for w in m["channel"]["alternatives"][0]["words"]]
        assert min(later, default=end + 1) >= end + 1.0
    # Metadata last: the audio's length and hash, the model served and the one asked for.
    meta = client.events[-1]
    assert meta["type"] == "Metadata" and meta["duration"] == round(len(audio) / 32000, 3)
    assert meta["sha256"] == hashlib.sha256(audio).hexdigest() and meta["channels"] == 1
    assert meta["request_id"] == client.of("Results")[0]["metadata"]["request_id"]
    assert meta["requested"] == {"model": "nova-3", "language": "en-US"} and meta["warnings"] == []
    assert meta["model_info"][meta["models"][0]]["name"] == "tiny_streaming_fastconformer_rnnt"


def test_the_session_makes_partials_only_for_a_message_that_needs_them() -> None:
    """Without interim results, vad_events or utterance_end_ms no message needs a partial: the
    session makes none (each cost the words of the open utterance, every step; a thousand such
    streams saturated the front ends while native ones did not)."""
    base = "/v1/listen?encoding=linear16&sample_rate=16000&endpointing=false"
    assert not parse_options(base).start().interim_results
    for option in ("interim_results=true", "vad_events=true", "utterance_end_ms=1000"):
        assert parse_options(f"{base}&{option}").start().interim_results, option


def test_finalize_keepalive_and_endpointing_off() -> None:
    pcm = speech(gap_s=0.0)
    a, b = s16(pcm[:len(pcm) // 2]), s16(pcm[len(pcm) // 2:])

    async def main() -> tuple[Client, list[dict[str, Any]]]:
        async with running(config(idle_timeout_s=1.5)) as (_, url):
            native = await native_finals(url, a + b, 16000, endpointing=False, finalize_at=(len(a),))
            client = await connect(url, "encoding=linear16&sample_rate=16000&endpointing=false")
            await client.audio(a)
            await client.send("Finalize")
            first = await client.wait("Results", is_final=True)
            for _ in range(6):  # 3 s without audio: KeepAlive keeps the stream open
                await asyncio.sleep(0.5)
                await client.send("KeepAlive")
            await client.audio(b)
            await client.send("Finalize", channel=0)
            await client.wait("Results", 2, is_final=True)
            await client.send("CloseStream")
            assert await client.closed() == 1000
            assert first["from_finalize"]
        return client, native

    client, native = asyncio.run(main())
    finals = client.finals()
    assert not client.of("Results", is_final=False), "interim_results defaults to false"
    assert [transcript(f) for f in finals[:2]] == [f["text"] for f in native] and native[0]["text"]
    assert [(f["from_finalize"], f["speech_final"]) for f in finals[:2]] == [(True, False), (True, False)]
    # CloseStream after a Finalize: an empty last final, then Metadata.
    assert [m["type"] for m in client.events[len(finals) - 1:]][-2:] == ["Results", "Metadata"]
    assert not client.of("Error")


def test_mulaw_and_alaw_transcribe_like_native_8khz() -> None:
    pcm8k = speech(8000, gap_s=0.0)

    async def main() -> None:
        async with running(config()) as (_, url):
            for encoding, law in (("mulaw", "g711_ulaw"), ("alaw", "g711_alaw")):
                codes = g711_encode(pcm8k, law)
                decoded = G711[law][np.frombuffer(codes, np.uint8)]
                native = await native_finals(url, s16(decoded), 8000, endpointing=False)
                client = await connect(url, f"encoding={encoding}&sample_rate=8000&endpointing=false")
                await client.audio(codes, 800)
                await client.ws.send(b"")  # Deepgram's older close: an empty binary message
                assert await client.closed() == 1000
                assert [transcript(f) for f in client.finals()] == [f["text"] for f in native] and native[0]["text"]
    asyncio.run(main())


# Each refused query: what it is, and words the HTTP 400's message must hold.
BAD_QUERIES = [
    ("sample_rate=16000", "encoding is required"),
    ("encoding=opus&sample_rate=16000", "encoding \"opus\" is not supported"),
    ("encoding=linear16", "sample_rate is required"),
    ("encoding=linear16&sample_rate=96000", "sample_rate must be in 8000..48000"),
    ("encoding=linear16&sample_rate=16k", "sample_rate must be an integer"),
    ("encoding=linear16&sample_rate=16000&channels=2", "channels=\"2\" is not supported"),
    ("encoding=linear16&sample_rate=16000&interim_results=yes", "interim_results must be true or false"),
    ("encoding=linear16&sample_rate=16000&endpointing=0", "endpointing must be in 1..3600000"),
    ("encoding=linear16&sample_rate=16000&endpointing=soon", "endpointing must be an integer"),
    ("encoding=linear16&sample_rate=16000&utterance_end_ms=-5", "utterance_end_ms must be in 1..3600000"),
    ("encoding=linear16&sample_rate=16000&callback=https://example.com/x", "callback is not supported"),
    ("encoding=linear16&sample_rate=16000&redact=pci", "redact is not supported"),
    ("encoding=linear16&sample_rate=16000&punctuate=maybe", "punctuate must be true or false"),
    ("encoding=linear16&sample_rate=16000&extra=novalue", "extra must be key:value"),
]
# Each bad client message and the variant of its (non-fatal) Error.
BAD_MESSAGES: list[str] = [
    "{not json", "[\"Finalize\"]", json.dumps({"type": "Finalise"}), json.dumps({"type": "Finalize", "channel": 1}),
    json.dumps({"type": "Configure", "features": {"numerals": True}}), json.dumps({"text": "hello"}),
    "[" * 100_000 + "]" * 100_000,
]


def test_bad_parameters_and_messages_get_clear_errors_and_leave_streams_untouched() -> None:
    audio = s16(speech())
    half = len(audio) // 2 // PIECE * PIECE

    async def listen_run(url: str, bad: bool = False) -> Client:
        query = "encoding=linear16&sample_rate=16000"
        if bad:  # accepted, not honoured: reported as warnings
            query += "&punctuate=true&smart_format=false&keywords=streamd:2&frobnicate=1&diarize=true"
        client = await connect(url, query)
        await client.audio(audio[:half])
        for i, message in enumerate(BAD_MESSAGES if bad else []):
            await client.ws.send(message)
            error = await client.wait("Error", 4 + i + 1)
            assert error["variant"] == "SchemaError" and error["description"], error
            await client.audio(audio[half + i * PIECE:half + (i + 1) * PIECE])  # good audio between
        await client.audio(audio[half + (len(BAD_MESSAGES) if bad else 0) * PIECE:])
        await client.send("CloseStream")
        assert await client.closed() == 1000
        return client

    async def main() -> tuple[Client, Client, Any, list[dict[str, Any]]]:
        async with running(config()) as (app, url):
            for query, words in BAD_QUERIES:
                with pytest.raises(websockets.InvalidStatus) as refused:
                    await connect(url, query)
                r = refused.value.response
                body = json.loads(r.body)
                assert r.status_code == 400 and words in body["err_msg"], (query, body)
                assert body["err_code"] == "INVALID_QUERY_PARAMETER" and r.headers["dg-error"] == body["err_msg"]
            value = app.state.metrics.registry.get_sample_value("streamd_connections_rejected_total",
                                                                {"reason": "bad_request"})
            assert value == len(BAD_QUERIES)
            native_clean = await native_finals(url, audio, 16000)
            bad, bystander, native = await asyncio.gather(
                listen_run(url, bad=True), listen_run(url),
                stream_pcm(url, audio, np.random.default_rng(1),
                           {"type": "start", "sample_rate": 16000, "encoding": "s16le"}))
        return bad, bystander, native, native_clean

    bad, bystander, native, native_clean = asyncio.run(main())
    expected = [f["text"] for f in native_clean]
    assert [f["text"] for f in native.of("final")] == expected
    assert [transcript(f) for f in bystander.finals()] == expected and not bystander.of("Error")
    assert [transcript(f) for f in bad.finals()] == expected, "bad messages lose no audio"
    warnings = bad.of("Error", variant="UnsupportedParameter")
    assert [w["message"] for w in warnings] == ["punctuate", "keywords", "frobnicate", "diarize"]
    assert bad.events[:4] == warnings[:4], "warnings come first"
    assert "punctuate=true is not supported" in warnings[0]["description"]
    assert "unknown parameter frobnicate" in warnings[2]["description"]
    assert [w["parameter"] for w in bad.events[-1]["warnings"]] == ["punctuate", "keywords", "frobnicate", "diarize"]
    assert len(bad.of("Error")) == 4 + len(BAD_MESSAGES)


def test_token_auth_limits_idle_and_shutdown_are_shared(tmp_path: Path) -> None:
    audio = s16(speech(gap_s=0.0))
    (tmp_path / "token").write_text(TOKEN + "\n")

    async def no_streams(app: Any) -> None:
        async with asyncio.timeout(10):
            while app.state.live:
                await asyncio.sleep(0.05)

    async def main() -> None:
        async with running(config(max_streams=1, idle_timeout_s=2.0, token_file=tmp_path / "token")) as (app, url):
            for headers in ({}, {"Authorization": "Token wrong"}):
                with pytest.raises(websockets.InvalidStatus) as refused:
                    await connect(url, additional_headers=headers)
                assert refused.value.response.status_code == 401
            auth = {"Authorization": f"Token {TOKEN}"}
            native = await websockets.connect(url + "/v1/stream", additional_headers=auth)
            with pytest.raises(websockets.InvalidStatus) as refused:
                await connect(url, additional_headers=auth)
            assert refused.value.response.status_code == 503
            await native.close()
            await no_streams(app)
            idle = await connect(url, additional_headers=auth)
            error = await idle.wait("Error", timeout=10)
            assert error["variant"] == "idle_timeout" and await idle.closed() == 1008
            await no_streams(app)
            # Shutdown: the audio sent is transcribed, Metadata follows, the close says "going away".
            client = await connect(url, "encoding=linear16&sample_rate=16000&interim_results=true&endpointing=false",
                                   additional_headers=auth)
            await client.audio(audio)
            await client.wait("Results")
            app.state.shutdown.set()
            assert await client.closed() == 1001
            assert [m["type"] for m in client.events[-2:]] == ["Results", "Metadata"]
            assert transcript(client.finals()[-1])
    asyncio.run(main())


def test_deepgram_sdk_live_client_transcribes_like_the_native_protocol() -> None:
    from deepgram import AsyncDeepgramClient, DeepgramClientEnvironment
    from deepgram.listen.v1.types import ListenV1Metadata, ListenV1Results, ListenV1SpeechStarted, ListenV1UtteranceEnd

    audio = s16(speech())

    async def sdk_run(url: str) -> list[Any]:
        http = url.replace("ws://", "http://")
        env = DeepgramClientEnvironment(base=http, production=url, agent=url, agent_rest=http)
        client = AsyncDeepgramClient(api_key=TOKEN, environment=env)
        received: list[Any] = []
        async with client.listen.v1.connect(model="nova-3", encoding="linear16", sample_rate=16000,
                                            interim_results="true", vad_events="true", utterance_end_ms="1000",
                                            punctuate="false", smart_format="false") as conn:
            for chunk in pieces(audio, PIECE):
                await conn.send_media(chunk)
            await conn.send_keep_alive()
            await conn.send_finalize()
            await conn.send_close_stream()
            async for message in conn:
                received.append(message)
        return received

    async def main() -> tuple[list[Any], list[dict[str, Any]]]:
        async with running(config(token_file=None)) as (_, url):
            received, native = await asyncio.gather(sdk_run(url), native_finals(url, audio, 16000,
                                                                               finalize_at=(len(audio),)))
        return received, native

    received, native = asyncio.run(main())
    finals = [m for m in received if isinstance(m, ListenV1Results) and m.is_final]
    assert [f.channel.alternatives[0].transcript for f in finals] == [f["text"] for f in native]
    assert [f.from_finalize for f in finals] == [f["reason"] == "finalize" for f in native]
    assert [f.speech_final for f in finals] == [f["reason"] == "endpoint" for f in native]
    assert finals[0].channel.alternatives[0].words[0].confidence == 1.0
    assert any(isinstance(m, ListenV1SpeechStarted) for m in received)
    assert any(isinstance(m, ListenV1UtteranceEnd) for m in received)
    assert isinstance(received[-1], ListenV1Metadata) and received[-1].channels == 1
