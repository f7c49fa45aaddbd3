"""The speech gate's analysis (streamd.audio.activity) decides each 20 ms frame exactly as a
straightforward reference does (a loop over frames: FFT, band power, level, the floor of the 1.5 s
before it), whatever the pieces the audio arrives in and whatever was forgotten in between."""
from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from streamd.audio.activity import ANALYSE_S, BAND_HZ, BATCH_FRAMES, FLOOR_S, FRAME_S, Activity, ActivityBatch

THRESHOLDS = [(-70.0, 9.0), (-45.0, 3.0), (-90.0, 20.0), (-70.0, 0.0)]  # the default (min_dbfs, rise_db), then others


def reference(x: np.ndarray, rate: int, min_dbfs: float, rise_db: float) -> list[bool]:
    """Each whole frame of `x`: at least `min_dbfs` in the band, and `rise_db` above the quietest
    of the `FLOOR_S` seconds of frames before it (the first frame: above itself)."""
    frame, window = round(rate * FRAME_S), round(FLOOR_S / FRAME_S)
    hann = np.hanning(frame)
    bins = np.fft.rfftfreq(frame, 1 / rate)
    band = (bins >= BAND_HZ[0]) & (bins <= BAND_HZ[1])
    scale = 2 / (np.sum(hann ** 2) * frame)
    levels: list[float] = []
    active = []
    for i in range(x.size // frame):
        spectrum = np.fft.rfft(x[i * frame:(i + 1) * frame].astype(np.float32) * hann)
        power = np.sum(np.abs(spectrum[band]) ** 2) * scale
        level = max(10 * np.log10(max(power, 1e-30)), -200.0)
        before = levels[max(0, i - window):i]
        floor = min(before) if before else level
        active.append(bool(level >= min_dbfs and level >= floor + rise_db))
        levels.append(level)
    return active


def speech_like(rng: np.random.Generator, rate: int, seconds: float) -> np.ndarray:
    """Voiced syllables (a wandering pitch with harmonics, 3-6 a second, quiet to loud) with
    pauses, over faint noise."""
    n = round(rate * seconds)
    t = np.arange(n) / rate
    pitch = 120 + 40 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = np.zeros(n)
    at = 0
    while at < n:
        length = round(rate * rng.uniform(0.08, 0.3))
        envelope[at:at + length] = np.hanning(length)[: n - at] * 10 ** (rng.uniform(-60, -10) / 20)
        at += length + round(rate * rng.choice([0.02, 0.06, 0.4]))
    return voice * envelope + 10 ** (-75 / 20) * rng.normal(size=n)


@cache
def signals(rate: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(30)
    n = 6 * rate
    t = np.arange(n) / rate
    tone = np.where(t > 2.5, 0.2 * np.sin(2 * np.pi * 700 * t), 0.0)
    return {"speech-like": speech_like(rng, rate, 6), "quiet speech-like": 0.02 * speech_like(rng, rate, 6),
            "speech-like in noise": speech_like(rng, rate, 6) + 0.01 * rng.normal(size=n),
            "white noise": 0.05 * rng.normal(size=n), "digital silence": np.zeros(n),
            "a tone that starts": tone, "noise bursts": rng.normal(size=n) * (np.sin(2 * np.pi * 1.3 * t) > 0.6)}


@cache
def expected_frames(rate: int, name: str, min_dbfs: float, rise_db: float) -> list[bool]:
    return reference(signals(rate)[name].astype(np.float32), rate, min_dbfs, rise_db)


def pieces(rng: np.random.Generator, size: int, how: str) -> list[int]:
    """Where to cut `size` samples: every 40 ms, odd and random sizes, one sample, all at once."""
    if how == "whole":
        return []
    if how == "random":
        return sorted(rng.integers(1, size, 200).tolist())
    step = {"40 ms": 640, "odd": 333, "one frame and a sample": 321, "tiny": 37}[how]
    return list(range(step, size, step))


def frames_of(a: Activity, first: int = 0) -> list[bool]:
    """The decision of each frame from `first` on, asked for the middle of the frame alone."""
    return [a.active((i + 0.25) * FRAME_S, (i + 0.75) * FRAME_S) for i in range(first, a.frames)]


@pytest.mark.parametrize("rate", [16000, 8000])
@pytest.mark.parametrize("how", ["40 ms", "odd", "one frame and a sample", "tiny", "random", "whole"])
def test_frames_are_the_reference_s_in_any_pieces(rate: int, how: str) -> None:
    rng = np.random.default_rng(1)
    for name, x in signals(rate).items():
        x = x.astype(np.float32)
        for min_dbfs, rise_db in THRESHOLDS:
            expected = expected_frames(rate, name, min_dbfs, rise_db)
            a = Activity(rate, min_dbfs, rise_db)
            for piece in np.split(x, pieces(rng, x.size, how)):
                a.push(piece)
            assert a.frames == len(expected) == x.size // round(rate * FRAME_S)
            assert frames_of(a) == expected, (name, min_dbfs, rise_db)
            if (min_dbfs, rise_db) == THRESHOLDS[0] and name == "speech-like":
                assert 0.2 < np.mean(expected) < 0.8  # speech and pauses: both decisions tested
            if (min_dbfs, rise_db) == THRESHOLDS[0] and name in ("digital silence", "white noise"):
                assert not any(expected), name


def test_forgetting_keeps_the_later_frames() -> None:
    """As a session uses it: pushes of 40 ms, each followed by forgetting all but the last 0.3 s;
    the frames still asked about are the reference's, and a window reaching past what was forgotten
    sees only what is kept."""
    x = speech_like(np.random.default_rng(2), 16000, 8).astype(np.float32)
    expected = reference(x, 16000, -70.0, 9.0)
    a = Activity(16000, -70.0, 9.0)
    for at in range(0, x.size, 640):
        a.push(x[at:at + 640])
        a.forget((at + 640) / 16000 - 0.3)
        first = max(0, int(((at + 640) / 16000 - 0.3) / FRAME_S))
        assert frames_of(a, first) == expected[first:a.frames]
        assert a.active(0.0, a.frames * FRAME_S) == any(expected[first:a.frames])


def test_audio_waits_for_analysis_at_most_analyse_s() -> None:
    """Pushes keep their samples until a frame is asked about, but never more than `ANALYSE_S`."""
    a = Activity(16000, -70.0, 9.0)
    for i in range(100):
        a.push(np.zeros(640, np.float32))
        assert a._waiting_size < 16000 * ANALYSE_S
    assert a.frames == 200 and a._waiting_size == 0


def test_forgetting_analyses_nothing() -> None:
    """A step whose tokens need no decision only forgets: its audio waits for the next question
    (or `ANALYSE_S`), and the forgotten frames are gone once it is analysed."""
    x = speech_like(np.random.default_rng(3), 16000, 2).astype(np.float32)
    expected = reference(x, 16000, -70.0, 9.0)
    a = Activity(16000, -70.0, 9.0)
    a.push(x[:2560])
    a.forget(0.1)
    assert a._waiting_size == 2560 and not a._active  # nothing analysed yet
    a.push(x[2560:])
    assert a.frames == len(expected) and a._first == 5
    assert frames_of(a, 5) == expected[5:]
    assert a.active(0.0, 0.2) == any(expected[5:10])  # the window reaching back sees only what is kept


def test_an_active_frame_decided_answers_without_analysing_the_audio_waiting() -> None:
    """As a session asks (a token's window reaches from 1 s before it to past the audio received):
    every answer is the reference's over the frames there are, and when a frame decided already
    is active the audio waiting stays waiting (decisions never change once made)."""
    x = speech_like(np.random.default_rng(4), 16000, 6).astype(np.float32)
    expected = reference(x, 16000, -70.0, 9.0)
    a = Activity(16000, -70.0, 9.0)
    early = 0
    for at in range(0, x.size, 1600):
        a.push(x[at:at + 1600])
        t = (at + 1600) / 16000
        waiting = a._waiting_size
        frames = (at + 1600) // 320
        assert a.active(t - 1.0, t + 1.2) == any(expected[max(0, int((t - 1.0) / FRAME_S)):frames])
        if waiting and a._waiting_size == waiting:
            early += 1
            assert any(a._active[max(0, int((t - 1.0) / FRAME_S)) - a._first:])
    assert early > 10


def test_streams_of_one_batch_decide_each_as_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Streams sharing an `ActivityBatch` (a front end's): a question to one analyses every stream's
    waiting audio in one FFT a rate, and each stream decides its frames as the reference does for it alone,
    whatever its thresholds, its pieces, and how much it has waiting (a second at once: several
    blocks of frames) beside the others; a stream of another rate in the same batch too."""
    ffts = []
    rfft = np.fft.rfft
    monkeypatch.setattr(np.fft, "rfft", lambda *a, **k: ffts.append(1) or rfft(*a, **k))
    rng = np.random.default_rng(5)
    batch = ActivityBatch()
    streams = []  # (activity, its pieces, the reference's frames)
    for rate in (16000, 8000):
        for k, (name, x) in enumerate(signals(rate).items()):
            min_dbfs, rise_db = THRESHOLDS[k % len(THRESHOLDS)]
            x = x.astype(np.float32)
            how = ["40 ms", "odd", "random", "tiny"][k % 4]
            cut = [] if k == 2 else pieces(rng, x.size, how)  # one stream pushes its 6 s at once
            streams.append((Activity(rate, min_dbfs, rise_db, batch), np.split(x, cut),
                            expected_frames(rate, name, min_dbfs, rise_db)))
    asks = 0
    for turn in range(max(len(p) for _, p, _ in streams)):
        for a, parts, _ in streams:
            if turn < len(parts):
                a.push(parts[turn])
        if turn % 7 == 0 and len(batch):
            before = len(ffts)
            waiting = [a for a, _, _ in streams if a._waiting]
            rates = {a.rate for a in waiting if a._rest.size + a._waiting_size >= a.frame}  # a whole frame waits
            for rate in rates:  # each rate's frames (a partial one counts) fit one FFT call (`BATCH_FRAMES`)
                assert sum(-(-(a._rest.size + a._waiting_size) // a.frame) for a in waiting if a.rate == rate) <= BATCH_FRAMES
            asked = waiting[turn % len(waiting)]
            asked.frames  # noqa: B018 (a question about a stream with audio waiting: analyses the batch)
            assert len(batch) == 0 and all(not a._waiting for a, _, _ in streams)
            assert len(ffts) - before == len(rates)  # one FFT a rate
            asks += len(rates) == 2
    assert asks > 10
    for a, _, expected in streams:
        assert a.frames == len(expected)
        assert frames_of(a) == expected


def test_a_batch_s_fft_calls_take_at_most_batch_frames() -> None:
    """A batch of many streams analyses them in FFT calls of at most `BATCH_FRAMES` frames (a
    stream's frames in one call), each stream still deciding as it would alone."""
    x = speech_like(np.random.default_rng(6), 16000, 3).astype(np.float32)
    expected = reference(x, 16000, -70.0, 9.0)
    batch = ActivityBatch()
    streams = [Activity(16000, -70.0, 9.0, batch) for _ in range(40)]
    calls = []
    rfft = np.fft.rfft
    for at in range(0, x.size, 2560):  # 160-ms chunks: 8 frames a stream, 320 a step of 40 streams
        for a in streams:
            a.push(x[at:at + 2560])
        with pytest.MonkeyPatch.context() as m:
            m.setattr(np.fft, "rfft", lambda frames, **k: calls.append(len(frames)) or rfft(frames, **k))
            streams[0].frames  # noqa: B018 (a question: analyses the batch)
    assert max(calls) <= BATCH_FRAMES and len(calls) >= 2 * (x.size // 2560)
    assert all(frames_of(a) == expected for a in streams)


def test_a_stream_whose_audio_others_analyse_drops_what_it_forgot() -> None:
    """Streams of a batch whose questions find their frames decided already (another stream's
    question analysed the batch) still drop the frames they forgot: no stream's frames grow with
    its length."""
    x = speech_like(np.random.default_rng(7), 16000, 8).astype(np.float32)
    batch = ActivityBatch()
    asker, other = Activity(16000, -70.0, 9.0, batch), Activity(16000, -70.0, 9.0, batch)
    for at in range(0, x.size, 2560):
        end = (at + 2560) / 16000
        for a in (asker, other):
            a.push(x[at:at + 2560])
        asker.active(end - 1.0, end)
        other.active(end - 1.0, end)  # answered from the frames the asker's question decided
        for a in (asker, other):
            a.forget(end - 0.3)
    assert len(other._active) <= 0.3 / FRAME_S + 8 and other._first > 0  # before a question of its own
    assert other.frames == asker.frames == x.size // 320
