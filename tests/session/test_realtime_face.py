"""The Realtime face without I/O: native results become the spec's transcription events."""
from __future__ import annotations

import json

from streamd import protocol as p
from streamd.config import EndpointingConfig
from streamd.session.realtime import RealtimeError, RealtimeFace, SessionConfig


def events(texts: list[str]) -> list[dict]:
    return [json.loads(t) for t in texts]


def face(vad: bool = True) -> RealtimeFace:
    f = RealtimeFace("abc", "tiny", EndpointingConfig())
    f.config = SessionConfig(vad=vad)
    return f


def test_an_utterance_with_server_vad() -> None:
    f = face()
    first = events(f.result(p.Partial(0, "hel", 0.5, 0.9, 1.0)))
    assert [e["type"] for e in first] == ["input_audio_buffer.speech_started",
                                          "conversation.item.input_audio_transcription.delta"]
    assert first[0]["audio_start_ms"] == 500 and first[1]["delta"] == "hel" and first[1]["item_id"] == "item_abc_0"
    assert [e["delta"] for e in events(f.result(p.Partial(0, "hello", 0.5, 1.1, 1.2)))] == ["lo"]  # what it appends
    assert events(f.result(p.Partial(0, "help", 0.5, 1.1, 1.3))) == []  # a revision waits for `completed`
    done = events(f.result(p.Final(0, "hello there", 0.5, 1.6, 2.0, "endpoint")))
    assert [e["type"] for e in done] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                                         "conversation.item.input_audio_transcription.delta",
                                         "conversation.item.input_audio_transcription.completed"]
    assert done[0]["audio_end_ms"] == 1600 and done[1]["previous_item_id"] is None
    assert done[3]["transcript"] == "hello there" and done[3]["usage"] == {"type": "duration", "seconds": 1.1}
    second = events(f.result(p.Final(1, "bye", 2.0, 2.4, 3.0, "endpoint")))
    assert second[0]["type"] == "input_audio_buffer.speech_started"  # no partial came first
    assert second[2]["previous_item_id"] == "item_abc_0"
    ids = [e["event_id"] for e in first + done + second]
    assert len(set(ids)) == len(ids) and all(i.startswith("event_abc_") for i in ids)


def test_commits_without_vad_and_an_empty_end_of_stream() -> None:
    f = face(vad=False)
    partial = events(f.result(p.Partial(0, "hi", 0.1, 0.3, 0.5)))
    assert [e["type"] for e in partial] == ["conversation.item.input_audio_transcription.delta"]
    final = events(f.result(p.Final(0, "hi", 0.1, 0.3, 0.6, "finalize")))
    assert [e["type"] for e in final] == ["input_audio_buffer.committed",
                                          "conversation.item.input_audio_transcription.completed"]
    assert f.result(p.Final(1, "", 0.6, 0.6, 0.6, "end_of_stream")) == []


def test_errors_and_the_session_object() -> None:
    f = face()
    error = json.loads(f.error(RealtimeError("invalid_value", "bad", "session.type"), "ev1"))
    assert error["type"] == "error" and error["error"] == {"type": "invalid_request_error", "code": "invalid_value",
                                                           "message": "bad", "param": "session.type", "event_id": "ev1"}
    ga, beta = f.describe(beta=False), f.describe(beta=True)
    assert ga["id"] == beta["id"] == "sess_abc"
    assert ga["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert beta["input_audio_format"] == "pcm16" and beta["turn_detection"]["type"] == "server_vad"
