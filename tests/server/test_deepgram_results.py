"""The Deepgram face's ``Results`` text (streamd.server.deepgram.ResultsJson): byte for byte what
encoding the whole message gives, while each word is encoded once for all the partials that repeat it."""
from __future__ import annotations

import json
from typing import Any

import pytest

from streamd import protocol as p
from streamd.server import deepgram
from streamd.server.deepgram import CHANNEL_INDEX, ResultsJson
from streamd.session.core import Result

METADATA = {"request_id": "3f1c", "model_info": {"name": "fastconformer-l", "version": "dev", "arch": "streamd"},
            "model_uuid": "9e2a", "extra": {"team": "café \"q\" \\ \u2028"}}


def whole(result: Result, words: tuple[p.Word, ...]) -> str:
    """The message as one `json.dumps` of all of it (how the face encoded it before)."""
    final = isinstance(result, p.Final)
    reason = result.reason if isinstance(result, p.Final) else None
    text = result.text
    return json.dumps({
        "type": "Results", "channel_index": CHANNEL_INDEX,
        "duration": round(result.end - result.start, 3), "start": round(result.start, 3),
        "is_final": final, "speech_final": reason == "endpoint", "from_finalize": reason == "finalize",
        "channel": {"alternatives": [{
            "transcript": text, "confidence": 1.0 if text else 0.0,
            "words": [{"word": w.word, "start": w.start, "end": w.end, "confidence": 1.0,
                       "punctuated_word": w.word} for w in words]}]},
        "metadata": METADATA}, ensure_ascii=False, separators=(",", ":"))


def script() -> list[tuple[Result, tuple[p.Word, ...]]]:
    """A stream's results: partials that grow, revise their last word and its times, then finals by
    each reason; odd text and times; an empty final; the next utterance."""
    a, b = p.Word("naïve", 0.1, 0.42), p.Word('say "hi"\\', 0.42, 0.9)
    c1, c2, c3 = p.Word("tok", 0.9, 1.1), p.Word("tokyo", 0.9, 1.3), p.Word("東京\u2028", 0.9, 1.333)
    c2_later = p.Word("tokyo", 0.9, 1.34)  # the same word, ending later
    d = p.Word("x\n\t\u0001", 1.4, 1.6000000000000003)
    first = [(p.Partial(0, "naïve", 0.1, 0.42, 0.48), (a,)),
             (p.Partial(0, 'naïve say "hi"\\', 0.1, 0.9, 0.96), (a, b)),
             (p.Partial(0, 'naïve say "hi"\\ tok', 0.1, 1.1, 1.12), (a, b, c1)),
             (p.Partial(0, 'naïve say "hi"\\ tokyo', 0.1, 1.3, 1.44), (a, b, c2)),
             (p.Partial(0, 'naïve say "hi"\\ tokyo', 0.1, 1.34, 1.52), (a, b, c2_later)),
             (p.Partial(0, 'naïve say "hi"\\ 東京', 0.1, 1.333, 1.6), (a, b, c3)),
             (p.Partial(0, 'naïve say "hi"\\ 東京 x', 0.1, 1.6000000000000003, 1.7), (a, b, c3, d))]
    words = tuple(p.Word(w.word, w.start, w.end) for w in (a, b, c3, d))  # equal, not the same objects
    finals: list[tuple[Result, tuple[p.Word, ...]]] = [
        (p.Final(0, first[-1][0].text, 0.1, 1.6, 1.76, "endpoint", words), words)]
    e = p.Word("again", 2.04, 2.5)
    second = [(p.Partial(1, "again", 2.04, 2.5, 2.56), (e,)), (p.Partial(1, "again again", 2.04, 2.9, 2.96), (e, e)),
              (p.Final(1, "again again", 2.04, 2.9, 3.0, "finalize", (e, e)), (e, e)),
              (p.Final(2, "", 3.0, 3.0, 3.0, "max_utterance", ()), ()), (p.Partial(3, "", 3.2, 3.2, 3.2), ()),
              (p.Final(3, "z", 1e-4, 12345.6789, 12345.7, "end_of_stream", (p.Word("z", 1e-4, 12345.6789),)),
               (p.Word("z", 1e-4, 12345.6789),))]
    return first + finals + second


def test_results_are_the_whole_message_s_encoding() -> None:
    results = ResultsJson(METADATA)
    for result, words in script():
        text = results.encode(result, words)
        assert text == whole(result, words), result
        json.loads(text)


def test_each_word_is_encoded_once_while_messages_repeat_it(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[p.Word] = []

    def counting(body: Any) -> str:
        if "punctuated_word" in body:
            encoded.append(p.Word(body["word"], body["start"], body["end"]))
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"))

    monkeypatch.setattr(deepgram, "_json", counting)
    results = ResultsJson(METADATA)
    for result, words in script():
        assert results.encode(result, words) == whole(result, words)
    # the final's words were all in the last partial; "again" is twice in one message
    assert [w.word for w in encoded] == ["naïve", 'say "hi"\\', "tok", "tokyo", "tokyo", "東京\u2028",
                                         "x\n\t\u0001", "again", "z"]
