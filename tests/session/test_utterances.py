"""Cutting a token stream into utterances."""
from __future__ import annotations

from streamd.config import EndpointingConfig
from streamd.engine.types import ChunkResult
from streamd.session.utterances import UtteranceTracker


def chunk(tokens: list[int], times: list[int], start: int, end: int) -> ChunkResult:
    return ChunkResult(tokens, times, start, end)


def test_endpoint_final_spans_its_frames_and_next_utterance_continues() -> None:
    tr = UtteranceTracker(EndpointingConfig(silence_after_speech_ms=240, silence_without_speech_ms=0, max_utterance_ms=0), 80)
    out = tr.on_chunk(chunk([5, 6, 7], [1, 2, 9], 0, 8))  # speech at 1-2, silence 3-5 -> endpoint at 5
    final = [u for u in out if u.final]
    assert len(final) == 1
    u = final[0]
    assert (u.index, u.tokens, u.start, u.end, u.reason) == (0, [5, 6], 0, 6, "endpoint")
    partial = [u for u in out if not u.final]
    assert partial and partial[0].tokens == [7] and partial[0].start == 6 and partial[0].index == 1
    last = tr.close("end_of_stream", 12)
    assert last is not None and (last.index, last.tokens, last.start, last.end) == (1, [7], 6, 12)


def test_silence_only_utterance_sends_nothing() -> None:
    tr = UtteranceTracker(EndpointingConfig(silence_after_speech_ms=240, silence_without_speech_ms=400, max_utterance_ms=0), 80)
    assert tr.on_chunk(chunk([], [], 0, 14)) == []
    last = tr.close("end_of_stream", 14)  # stop/finalize are always answered, here with no text
    assert (last.index, last.tokens, last.reason) == (0, [], "end_of_stream") and tr.index == 1
