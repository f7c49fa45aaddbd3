"""Conversations with a `StreamSession`, without sockets, threads or an engine: client messages
and engine results in, server messages and engine commands out."""
from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import fixture_model
from streamd import protocol as p
from streamd.config import EndpointingConfig
from streamd.engine.types import ChunkResult
from streamd.engine.types import ChunkGeometry
from streamd.errors import ProtocolViolation
from streamd.session.core import End, Open, Push, Segment, StreamSession
from streamd.session.endpoint import EndpointRule

GEOMETRY = ChunkGeometry(right=1, subsampling=8, hop=160, sample_rate=16000)  # 80 ms frames
RULES = EndpointingConfig(silence_after_speech_ms=240, silence_without_speech_ms=0, max_utterance_ms=0)
TOK = fixture_model("rnnt").tokenizer
THE, FOX = TOK.encode("the"), TOK.encode("fox")  # [▁the], [▁f, o, x]


def start(**options: object) -> str:
    return json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le", **options})


STOP, FINALIZE = '{"type": "stop"}', '{"type": "finalize"}'


def pcm(seconds: float) -> bytes:
    return np.zeros(round(16000 * seconds), "<i2").tobytes()


def session(rules: EndpointingConfig = RULES) -> tuple[StreamSession, list[EndpointRule]]:
    endpoints: list[EndpointRule] = []
    return StreamSession(GEOMETRY, TOK, rules, endpoints.append), endpoints


def started(**options: object) -> tuple[StreamSession, Segment]:
    s, _ = session()
    s.receive(start(**options))
    [opened] = s.commands()
    assert isinstance(opened, Open)
    return s, opened.segment


def test_a_conversation() -> None:
    s, endpoints = session()
    assert s.receive(start()) == p.Start(16000, "s16le")
    [opened] = s.commands()
    assert opened == Open(seg := opened.segment, after=None) and seg.offset_s == 0.0
    assert s.rules == RULES

    assert s.receive(pcm(1.0)) is None
    [push] = s.commands()
    assert isinstance(push, Push) and push.segment is seg
    assert push.samples.dtype == np.float32 and push.samples.size == 16000
    assert (s.received_s, s.backlog_s) == (1.0, 1.0)

    # "the" on frame 1: a partial; frames 2-3 silent: the same text again is not repeated
    assert s.receive_result(seg, ChunkResult(THE, [1], 0, 2)) == [p.Partial(0, "the", 0.08, 0.16, 0.16)]
    assert s.receive_result(seg, ChunkResult([], [], 2, 4)) == []
    assert s.backlog_s == pytest.approx(1.0 - 0.32)
    # a third silent frame ends the utterance at frame 4; "fox" (frames 5-7) opens the next
    assert s.receive_result(seg, ChunkResult(FOX, [5, 6, 7], 4, 8)) == [
        p.Final(0, "the", 0.08, 0.16, 0.64, "endpoint"),  # where its word is, not the silence around it
        p.Partial(1, "fox", 0.4, 0.64, 0.64)]
    assert endpoints == [EndpointRule.SILENCE_AFTER_SPEECH]

    assert s.receive(STOP) == p.Stop()
    flush, end = s.commands()
    assert isinstance(flush, Push) and flush.segment is seg and flush.samples.size == 0
    assert end == End(seg, last=True) and s.segment is None
    assert s.segment_flushed(seg) == [p.Final(1, "fox", 0.4, 0.64, 0.64, "end_of_stream")]
    assert s.summary("stop", 2.5) == p.Summary(utterances=2, partials=2, audio_seconds=1.0, session_seconds=2.5,
                                               reason="stop")


def test_finalize_ends_the_segment_and_the_next_continues_in_stream_time() -> None:
    s, first = started()
    s.receive(pcm(0.5))
    s.commands()
    assert s.receive_result(first, ChunkResult(THE, [1], 0, 4)) == [p.Partial(0, "the", 0.08, 0.16, 0.32)]
    assert s.receive(FINALIZE) == p.Finalize()
    end, opened = s.commands()
    # `after`: a full engine frees `first`'s slot for the next segment
    assert end == End(first) and isinstance(opened, Open) and opened.after is first
    second = opened.segment
    assert second.offset_s == 0.5 and s.segment is second
    s.receive(pcm(0.5))
    [push] = s.commands()
    assert isinstance(push, Push) and push.segment is second

    # the finalized utterance holds all audio before the finalize; utterance numbers go on
    assert s.segment_flushed(first) == [p.Final(0, "the", 0.08, 0.16, 0.32, "finalize")]
    assert s.receive_result(second, ChunkResult(FOX, [0, 1, 2], 0, 5)) == [p.Partial(1, "fox", 0.5, 0.74, 0.9)]
    s.receive(STOP)
    s.commands()
    assert s.segment_flushed(second) == [p.Final(1, "fox", 0.5, 0.74, 0.9, "end_of_stream")]
    assert s.summary("stop", 1.0).utterances == 2


def test_finalize_and_stop_are_always_answered() -> None:
    s, first = started()
    s.receive(FINALIZE)
    [_, opened] = s.commands()
    assert isinstance(opened, Open)
    assert s.segment_flushed(first) == [p.Final(0, "", 0.0, 0.0, 0.0, "finalize")]
    s.receive(STOP)
    assert s.segment_flushed(opened.segment) == [p.Final(1, "", 0.0, 0.0, 0.0, "end_of_stream")]


def test_word_times_and_tokens() -> None:
    s, seg = started(word_times=True)
    s.receive(pcm(1.0))
    ids = TOK.encode("the fox")
    s.receive_result(seg, ChunkResult(ids, [1, 3, 4, 5], 0, 6))
    [final] = s.segment_flushed(seg)
    assert isinstance(final, p.Final)
    assert final.words == (p.Word("the", 0.08, 0.16), p.Word("fox", 0.24, 0.48))
    assert final.tokens == ("▁the", "▁f", "o", "x")


def test_times_are_where_the_words_are_and_end_within_the_audio() -> None:
    """A final's `start` is its first word's start (not the previous utterance's end, with the
    silence between), its `end` its last word's end; none is past the audio received (the last
    encoder frame reaches into the padding of a stream's end)."""
    s, seg = started(word_times=True)
    s.receive(pcm(1.0))
    # "the" on frame 1, silence to the endpoint, "fox" on frames 10-12 (the last one ends at 1.04 s)
    finals = [m for m in s.receive_result(seg, ChunkResult(THE + FOX, [1, 10, 11, 12], 0, 13))
              if isinstance(m, p.Final)]
    s.receive(STOP)
    s.commands()
    finals += s.segment_flushed(seg)
    assert [(f.text, f.start, f.end) for f in finals] == [("the", 0.08, 0.16), ("fox", 0.8, 1.0)]
    assert finals[1].words == (p.Word("fox", 0.8, 1.0),)
    assert finals[0].words is not None and finals[0].start == finals[0].words[0].start


def test_open_words_decode_each_word_about_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A face whose partials carry words (Deepgram's) asks for the open utterance's words after
    every step: each call decodes the words since the last, not the whole utterance again (that
    was quadratic in a long utterance and saturated the front ends at 1000 streams)."""
    s, seg = started(word_times=True, endpointing=False)
    s.receive(pcm(13.0))  # 80 words of 2 frames: 12.8 s
    decoded: list[int] = []
    decode = TOK.decode
    monkeypatch.setattr(TOK, "decode", lambda ids: decoded.append(len(ids)) or decode(ids))
    seen, tokens = [], 0
    for i, word in enumerate(["the", "fox"] * 40):  # a word every step of 2 frames, no endpoint
        s.receive_result(seg, ChunkResult(TOK.encode(word), [2 * i + 1] * len(TOK.encode(word)), 2 * i, 2 * i + 2))
        decoded.clear()
        seen.append(s.open_words())
        tokens += sum(decoded)
    assert tokens <= 2 * 3 * 80, "a call decodes the last word and the one before it, not every word"
    s.receive(STOP)
    s.commands()
    [final] = s.segment_flushed(seg)
    assert isinstance(final, p.Final) and final.words is not None and len(final.words) == 80
    assert all(words == final.words[:i + 1] for i, words in enumerate(seen))


def test_a_step_that_adds_no_token_decodes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Most steps add no token to the open utterance (a trained model emits ~0.1 a frame): their
    result sends nothing and decodes nothing (a front end decoded the whole open utterance at every
    step of every stream, and only then found its text unchanged)."""
    for interim in (True, False):
        s, seg = started(interim_results=interim, endpointing=False)
        s.receive(pcm(2.0))
        decoded: list[int] = []
        decode = TOK.decode
        monkeypatch.setattr(TOK, "decode", lambda ids: decoded.append(len(ids)) or decode(ids))
        sent = [s.receive_result(seg, ChunkResult(THE, [1], 0, 2))]
        sent += [s.receive_result(seg, ChunkResult([], [], f, f + 2)) for f in range(2, 12, 2)]
        sent += [s.receive_result(seg, ChunkResult(FOX, [13, 14, 15], 12, 16))]
        assert sent == ([[p.Partial(0, "the", 0.08, 0.16, 0.16)]] + [[]] * 5 + [[p.Partial(0, "the fox", 0.08, 1.28, 1.28)]]
                        if interim else [[]] * 7)
        assert decoded == ([1, 4] if interim else [])
        monkeypatch.undo()


def test_open_words_end_within_the_audio_as_it_comes() -> None:
    """A word past the audio received is clipped to it in the open words, and gets its own end
    once the audio is there (the words decoded before are not kept with the clipped time)."""
    s, seg = started(word_times=True, endpointing=False)
    s.receive(pcm(0.2))
    s.receive_result(seg, ChunkResult(FOX, [1, 2, 3], 0, 4))  # "fox" ends at frame 4: 0.32 s
    assert s.open_words() == (p.Word("fox", 0.08, 0.2),)
    s.receive(pcm(0.2))
    s.receive_result(seg, ChunkResult(THE, [4], 4, 5))
    assert s.open_words() == (p.Word("fox", 0.08, 0.32), p.Word("the", 0.32, 0.4))


def test_without_interim_results_only_finals() -> None:
    s, seg = started(interim_results=False)
    s.receive(pcm(1.0))
    assert s.receive_result(seg, ChunkResult(THE, [1], 0, 2)) == []
    assert s.segment_flushed(seg) == [p.Final(0, "the", 0.08, 0.16, 0.16, "end_of_stream")]
    assert s.summary("stop", 1.0).partials == 0


def test_start_overrides_the_endpoint_rules() -> None:
    s, seg = started(endpointing=False)
    assert s.rules == EndpointingConfig(0, 0, 0)
    s.receive(pcm(2.0))
    assert s.receive_result(seg, ChunkResult(THE, [1], 0, 20)) == [p.Partial(0, "the", 0.08, 0.16, 1.6)]
    s, _ = started(endpointing={"silence_after_speech_ms": 160})
    assert s.rules == EndpointingConfig(160, RULES.silence_without_speech_ms, RULES.max_utterance_ms)


def test_a_cleared_segment_sends_nothing_more() -> None:
    """`clear` (the realtime face): the segment's results from then on are dropped."""
    s, _ = session()
    s.begin(p.Start(16000, "s16le"))
    [opened] = s.commands()
    assert isinstance(opened, Open)
    first = opened.segment
    s.feed(pcm(1.0))
    assert s.receive_result(first, ChunkResult(THE, [1], 0, 2)) == [p.Partial(0, "the", 0.08, 0.16, 0.16)]
    s.finalize("clear")
    s.commands()
    assert s.receive_result(first, ChunkResult(FOX, [3, 4, 5], 2, 6)) == []
    assert s.segment_flushed(first) == []
    assert s.segment is not None
    assert s.receive_result(s.segment, ChunkResult(THE, [0], 0, 2)) == [p.Partial(1, "the", 1.0, 1.0, 1.0)]


@pytest.mark.parametrize(("messages", "error"), [
    ([pcm(0.1)], 'audio before "start"'),
    ([FINALIZE], 'the first message must be "start"'),
    ([start(), start()], '"start" was already sent'),
    ([start(), STOP, pcm(0.1)], 'audio after "stop"'),
    ([start(), STOP, FINALIZE], '"finalize" after the stream ended'),
])
def test_messages_out_of_order_are_refused(messages: list[str | bytes], error: str) -> None:
    s, _ = session()
    for message in messages[:-1]:
        s.receive(message)
    s.commands()
    with pytest.raises(ProtocolViolation, match=error):
        s.receive(messages[-1])
    assert s.commands() == []  # nothing for the engine


@pytest.mark.parametrize("rate", [8000, 24000, 44100, 48000])
def test_finalize_keeps_a_resampled_stream_s_audio_in_its_own_segment(rate: int) -> None:
    """The resampler holds back a few ms; at `finalize` they go to the segment it ends, not to
    the next utterance (loud noise, then silence after the finalize: the next segment is silent)."""
    s, _ = session()
    s.receive(json.dumps({"type": "start", "sample_rate": rate, "encoding": "s16le"}))
    [first] = s.commands()
    noise = (np.random.default_rng(0).uniform(-0.5, 0.5, rate) * 32767).astype("<i2").tobytes()
    s.receive(noise)
    s.receive(FINALIZE)
    s.receive(np.zeros(rate, "<i2").tobytes())
    pushed: dict[int, list[np.ndarray]] = {}
    for c in s.commands():
        if isinstance(c, Push):
            pushed.setdefault(id(c.segment), []).append(c.samples)
    before = np.concatenate(pushed[id(first.segment)])
    after = np.concatenate([x for k, v in pushed.items() if k != id(first.segment) for x in v])
    assert abs(before.size - 16000) <= 2  # all of the noise's second, at the model's rate
    assert np.abs(after).max() < 1e-3  # nothing of it in the next utterance
