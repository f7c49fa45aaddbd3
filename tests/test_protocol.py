"""Protocol v1 without sockets: parsing, serialisation, session order, close codes."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import streamd.errors as errors
from streamd.config import EndpointingConfig
from streamd.errors import ProtocolViolation, StreamdError, UnsupportedAudio
from streamd.protocol import (
    FATAL_ERRORS,
    HANDSHAKE_REFUSALS,
    PROTOCOL_VERSION,
    REALTIME_PATH,
    STREAM_PATH,
    ClientMessage,
    EndpointingOptions,
    Error,
    Final,
    Finalize,
    KeepAlive,
    Partial,
    Phase,
    Ready,
    ServerMessage,
    SessionProtocol,
    Start,
    Stop,
    Summary,
    Word,
    close_for,
    encode_client_message,
    encode_message,
    parse_client_message,
    parse_server_message,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
START = '{"type":"start","sample_rate":16000,"encoding":"s16le"}'

READY = Ready(session_id="abc", model="tiny", device="cuda:0", dtype="bf16", chunk_ms=160,
              sample_rate=44100, endpointing=EndpointingConfig(), idle_timeout_s=30.0,
              max_session_s=14400.0)
PARTIAL = Partial(utterance=0, text="hello", start=0.24, end=0.8, audio_processed=0.96)
FINAL = Final(utterance=0, text="hello world", start=0.24, end=1.12, audio_processed=2.08,
              reason="endpoint", words=(Word("hello", 0.24, 0.56), Word("world", 0.64, 1.12)),
              tokens=("▁hello", "▁wor", "ld"))
SUMMARY = Summary(utterances=1, partials=3, audio_seconds=2.5, session_seconds=2.7, reason="stop")


def start(**fields: object) -> str:
    return json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le", **fields})


def test_constants() -> None:
    assert (PROTOCOL_VERSION, STREAM_PATH, REALTIME_PATH) == ("1", "/v1/stream", "/v1/realtime")


def test_errors_not_to_retry_are_documented() -> None:
    """The clients' "do not reconnect" set is the documented one, and every code in it exists."""
    text = DOCS.read_text()
    paragraph = text[text.index("Reconnecting cannot help"):].split("\n\n", 1)[0]
    assert set(re.findall(r"`(\w+)`", paragraph)) == FATAL_ERRORS
    codes = {cls.code for cls in ERROR_CLASSES} | {code for code, _ in HANDSHAKE_REFUSALS.values()}
    assert FATAL_ERRORS <= codes


def test_minimal_start_takes_the_defaults() -> None:
    assert parse_client_message(START) == Start(
        sample_rate=16000, encoding="s16le", channels=1, interim_results=True, word_times=False,
        endpointing=EndpointingOptions())


def test_full_start() -> None:
    msg = parse_client_message(start(sample_rate=44100, encoding="f32le", channels=2,
                                     interim_results=False, word_times=True,
                                     endpointing={"silence_after_speech_ms": 400,
                                                  "max_utterance_ms": 0}))
    assert msg == Start(44100, "f32le", 2, False, True,
                        EndpointingOptions(silence_after_speech_ms=400, max_utterance_ms=0))


@pytest.mark.parametrize(("text", "cls"), [
    ('{"type":"finalize"}', Finalize), ('{"type":"stop"}', Stop), ('{"type":"keepalive"}', KeepAlive),
])
def test_controls(text: str, cls: type) -> None:
    assert parse_client_message(text) == cls()


@pytest.mark.parametrize(("text", "pattern"), [
    ("{not json", r"not valid JSON: .* at position 1"),
    ("[1, 2]", "must be a JSON object"),
    ('{"sample_rate": 16000}', r'unknown message type null; expected one of start, finalize'),
    ('{"type": "Start"}', r'unknown message type "Start"'),
    ('{"type": 3}', "unknown message type 3"),
    ('{"type": "stop", "now": true}', r"unknown field \"now\" in \"stop\"; allowed: $"),
    (start(sample_rte=8000), r"unknown field \"sample_rte\" in \"start\""),
    ('{"type":"start","encoding":"s16le"}', r'"start" needs "sample_rate"'),
    ('{"type":"start","sample_rate":16000}', r'"start" needs "encoding"'),
    (start(sample_rate="16000"), r'"sample_rate" must be an integer, got "16000"'),
    (start(sample_rate=16000.0), r'"sample_rate" must be an integer, got 16000.0'),
    (start(sample_rate=True), r'"sample_rate" must be an integer, got true'),
    (start(channels=None), r'"channels" must be an integer, got null'),
    (start(interim_results="yes"), r'"interim_results" must be true or false, got "yes"'),
    (start(word_times=1), r'"word_times" must be true or false, got 1'),
    (start(endpointing=5), r'"endpointing" must be an object, true or false'),
    (start(endpointing=None), r'"endpointing" must be an object, true or false'),
    (start(endpointing={"silence_ms": 5}), r"unknown field \"silence_ms\" in \"endpointing\""),
    (start(endpointing={"max_utterance_ms": -1}), r'"max_utterance_ms" must be in 0\.\.3600000 ms'),
    (start(endpointing={"max_utterance_ms": 1.5}), r'"max_utterance_ms" must be an integer'),
])
def test_malformed_messages_are_protocol_violations(text: str, pattern: str) -> None:
    with pytest.raises(ProtocolViolation, match=pattern) as info:
        parse_client_message(text)
    assert info.value.close_code == 1008


@pytest.mark.parametrize("fields", [
    {"sample_rate": 7999}, {"sample_rate": 96000}, {"encoding": "mulaw"}, {"channels": 9},
])
def test_unsupported_audio_formats(fields: dict[str, object]) -> None:
    with pytest.raises(UnsupportedAudio) as info:
        parse_client_message(start(**fields))
    assert info.value.close_code == 1003


def test_endpointing_true_false_and_overrides() -> None:
    defaults = EndpointingConfig(800, 5000, 30_000)
    on = parse_client_message(start(endpointing=True))
    off = parse_client_message(start(endpointing=False))
    some = parse_client_message(start(endpointing={"silence_after_speech_ms": 300}))
    assert isinstance(on, Start) and isinstance(off, Start) and isinstance(some, Start)
    assert on.endpointing.resolve(defaults) == defaults
    assert off.endpointing.resolve(defaults) == EndpointingConfig(0, 0, 0)
    assert not off.endpointing.resolve(defaults).enabled
    assert some.endpointing.resolve(defaults) == EndpointingConfig(300, 5000, 30_000)


@pytest.mark.parametrize("message", [
    Start(16000, "s16le"),
    Start(48000, "f32le", 2, False, True, EndpointingOptions(silence_without_speech_ms=0)),
    Start(8000, "s16le", endpointing=EndpointingOptions(disabled=True)),
    Finalize(), Stop(), KeepAlive(),
])
def test_client_messages_round_trip(message: ClientMessage) -> None:
    assert parse_client_message(encode_client_message(message)) == message


def test_final_serialisation() -> None:
    assert json.loads(encode_message(FINAL, 7)) == {
        "type": "final", "seq": 7, "utterance": 0, "text": "hello world", "start": 0.24, "end": 1.12,
        "audio_processed": 2.08, "reason": "endpoint",
        "words": [{"word": "hello", "start": 0.24, "end": 0.56},
                  {"word": "world", "start": 0.64, "end": 1.12}],
        "tokens": ["▁hello", "▁wor", "ld"],
    }


def test_type_and_seq_come_first_and_optional_fields_are_omitted() -> None:
    text = encode_message(Final(3, "hi", 1.0, 1.5, 2.0, "finalize"), 12)
    assert text.startswith('{"type":"final","seq":12,')
    assert "words" not in json.loads(text) and "tokens" not in json.loads(text)


def test_times_are_rounded_to_milliseconds() -> None:
    data = json.loads(encode_message(Partial(0, "x", 0.1 + 0.2, 1 / 3, 2.00049), 0))
    assert (data["start"], data["end"], data["audio_processed"]) == (0.3, 0.333, 2.0)


def test_ready_serialisation() -> None:
    data = json.loads(encode_message(READY, 0))
    assert data["protocol"] == "1"
    assert data["endpointing"] == {"silence_after_speech_ms": 800, "silence_without_speech_ms": 5000,
                                   "max_utterance_ms": 30000}
    assert data["type"] == "ready" and data["seq"] == 0 and data["sample_rate"] == 44100


@pytest.mark.parametrize("message", [READY, PARTIAL, FINAL, Final(1, "", 0.0, 0.0, 0.0, "end_of_stream"),
                                     Error("overloaded", "busy"), SUMMARY])
def test_server_messages_round_trip(message: ServerMessage) -> None:
    assert parse_server_message(encode_message(message, 5)) == message


@pytest.mark.parametrize("text", ["nope", "[]", '{"type":"hello"}', '{"type":"partial","text":"x"}'])
def test_parse_server_message_rejects_garbage(text: str) -> None:
    with pytest.raises(ProtocolViolation, match="not a protocol 1 server message"):
        parse_server_message(text)


def test_session_happy_path_numbers_messages() -> None:
    session = SessionProtocol()
    assert session.phase is Phase.AWAITING_START
    msg = session.receive_text(START)
    assert session.start == msg and session.phase is Phase.STREAMING
    session.receive_audio()
    assert session.receive_text('{"type":"keepalive"}') == KeepAlive()
    assert session.receive_text('{"type":"finalize"}') == Finalize()
    seqs = [json.loads(session.encode(m))["seq"] for m in (READY, PARTIAL, FINAL)]
    assert seqs == [0, 1, 2] and session.seq == 3
    assert session.receive_text('{"type":"stop"}') == Stop()
    assert session.phase is Phase.STOPPED
    assert json.loads(session.encode(SUMMARY))["seq"] == 3
    assert session.phase is Phase.CLOSED


@pytest.mark.parametrize(("before", "action", "pattern"), [
    ([], lambda s: s.receive_audio(), 'audio before "start"'),
    ([], lambda s: s.receive_text('{"type":"keepalive"}'), 'first message must be "start", got "keepalive"'),
    ([START], lambda s: s.receive_text(START), '"start" was already sent'),
    ([START, '{"type":"stop"}'], lambda s: s.receive_audio(), 'audio after "stop"'),
    ([START, '{"type":"stop"}'], lambda s: s.receive_text('{"type":"finalize"}'),
     '"finalize" after the stream ended'),
])
def test_session_rejects_out_of_order_client_messages(before: list[str], action: object,
                                                      pattern: str) -> None:
    session = SessionProtocol()
    for text in before:
        session.receive_text(text)
    with pytest.raises(ProtocolViolation, match=pattern):
        action(session)  # type: ignore[operator]


def test_session_refuses_to_send_out_of_order() -> None:
    session = SessionProtocol()
    with pytest.raises(RuntimeError, match="before 'ready'"):
        session.encode(PARTIAL)
    assert session.seq == 0
    first = json.loads(session.encode(Error("unsupported_audio", "bad rate")))
    assert first == {"type": "error", "seq": 0, "code": "unsupported_audio", "message": "bad rate"}
    with pytest.raises(RuntimeError, match="session is closed"):
        session.encode(SUMMARY)


def test_error_from_exception_and_close_codes() -> None:
    exc = errors.Overloaded("no free slot")
    assert Error.from_exception(exc) == Error("overloaded", "no free slot")
    assert close_for(exc) == (1013, "no free slot")
    assert close_for(errors.ConfigError("x"))[0] == 1011  # no close code of its own: internal


def test_close_reason_is_truncated_to_123_utf8_bytes() -> None:
    code, reason = close_for(ProtocolViolation("é" * 100))
    assert code == 1008
    assert len(reason.encode()) <= 123 and reason == "é" * 61


def test_echoed_lone_surrogates_are_escaped() -> None:
    """JSON may carry a lone surrogate ("\\ud800"); echoed in an error it must still encode."""
    with pytest.raises(UnsupportedAudio) as e:
        parse_client_message(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "\ud800"}))
    assert "\\ud800" in e.value.message
    assert close_for(e.value)[1].encode() and encode_message(Error.from_exception(e.value), 1).encode()


ERROR_CLASSES = [cls for cls in vars(errors).values()
                 if isinstance(cls, type) and issubclass(cls, StreamdError) and cls is not StreamdError]


def test_error_codes_are_unique_and_documented() -> None:
    codes = [cls.code for cls in ERROR_CLASSES]
    assert len(codes) == len(set(codes))
    docs = DOCS.read_text()
    for cls in ERROR_CLASSES:
        if cls.close_code is not None:
            assert re.search(rf"`{cls.code}`.*\b{cls.close_code}\b", docs), cls.__name__
    table = docs.split("## Error codes", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \| \d{4} \|", table, re.M))
    assert documented == {cls.code for cls in ERROR_CLASSES if cls.close_code is not None}  # none never sent


def test_close_codes() -> None:
    assert {cls.__name__: cls.close_code for cls in ERROR_CLASSES} == {
        "ConfigError": None, "ProtocolViolation": 1008, "UnsupportedAudio": 1003, "IdleTimeout": 1008,
        "SessionExpired": 1008, "BacklogExceeded": 1008, "SlowConsumer": 1008, "Overloaded": 1013,
        "InternalError": 1011,
    }


@pytest.mark.parametrize(("text", "pattern"), [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"type": "start", "sample_rate": ' + "9" * 5000 + "}", "a number is too long"),
    (json.dumps({"type": "t" * 1_000_000}), r'unknown message type "t{63}\.\.\. \(1000002 characters\)'),
    (json.dumps({"type": "stop", "k" * 1_000_000: 1}), r'unknown field "k{63}\.\.\. \(1000002 characters\)'),
    (start(sample_rate="s" * 1_000_000), r'got "s{63}\.\.\. \(1000002 characters\)$'),
    (start(encoding="e" * 1_000_000), r'encoding "e{63}\.\.\. \(1000002 characters\)'),
])
def test_hostile_json_is_a_short_protocol_violation(text: str, pattern: str) -> None:
    """Deep nesting and huge numbers are client faults, and what is echoed back is cut short."""
    with pytest.raises((ProtocolViolation, UnsupportedAudio), match=pattern) as info:
        parse_client_message(text)
    assert len(info.value.message) < 200


def test_a_huge_endpointing_value_is_not_echoed_whole() -> None:
    with pytest.raises(ProtocolViolation) as err:
        parse_client_message('{"type": "start", "sample_rate": 16000, "encoding": "s16le", '
                             '"endpointing": {"max_utterance_ms": ' + "9" * 4000 + "}}")
    assert "must be in 0..3600000 ms" in err.value.message and len(err.value.message) < 200
