"""Endpointer rules, frame accounting and chunking invariance."""
from __future__ import annotations

import random

import pytest

from streamd.config import EndpointingConfig
from streamd.session.endpoint import Endpointer, EndpointRule
from streamd.engine.types import ChunkGeometry
from streamd.model.dims import ModelDims
from streamd.server.metrics import ENDPOINT_RULES

S, _ = True, False  # speech frame, silent frame
FRAME_MS = 80  # the encoder frame of the models streamd runs: 8 mel frames of 160 samples at 16 kHz


def rules(after: int = 0, without: int = 0, max_ms: int = 0) -> EndpointingConfig:
    return EndpointingConfig(after, without, max_ms)


def all_endpoints(ep: Endpointer, flags: list[bool]) -> list[tuple[int, EndpointRule]]:
    """Feed ``flags`` with the documented loop; collect (end frame, rule)."""
    found = []
    first = ep.position
    while (end := ep.update(flags[ep.position - first:])) is not None:
        assert ep.fired is not None
        found.append((end, ep.fired))
    return found


def test_frame_is_80_ms() -> None:
    """The frame the endpointer is given is derived from the model's dims (hop, subsampling, rate)."""
    g = ChunkGeometry.of(ModelDims(vocab_size=1), 0)
    assert (g.frame_ms, g.frame_seconds, g.chunk_ms) == (FRAME_MS, FRAME_MS / 1000, 80)
    assert ChunkGeometry.of(ModelDims(vocab_size=1), 13).chunk_ms == 1120


def test_silence_after_speech_fires_on_the_nth_silent_frame() -> None:
    ep = Endpointer(rules(after=800), FRAME_MS)  # 10 frames
    assert ep.update([S, S] + [_] * 9) is None
    assert ep.trailing_silence == 9 and ep.speech
    assert ep.update([_]) == 11
    assert ep.fired is EndpointRule.SILENCE_AFTER_SPEECH
    assert (ep.position, ep.utterance_start, ep.trailing_silence, ep.speech) == (12, 12, 0, False)


def test_limits_round_up_to_whole_frames() -> None:
    ep = Endpointer(rules(after=850), FRAME_MS)  # 10.6 -> 11 frames
    assert ep.update([S] + [_] * 10) is None
    assert ep.update([_]) == 11


def test_speech_restarts_the_silence_count() -> None:
    ep = Endpointer(rules(after=400), FRAME_MS)  # 5 frames
    assert ep.update([S] + [_] * 4 + [S] + [_] * 4) is None
    assert ep.update([_]) == 10


def test_silence_without_speech_only_applies_before_speech() -> None:
    ep = Endpointer(rules(without=400), FRAME_MS)  # 5 frames
    assert ep.update([_] * 4) is None
    assert not ep.speech
    assert ep.update([_]) == 4
    assert ep.fired is EndpointRule.SILENCE_WITHOUT_SPEECH
    # Once there is speech, silence-without-speech no longer fires.
    assert ep.update([S] + [_] * 50) is None


def test_silence_after_speech_does_not_fire_without_speech() -> None:
    ep = Endpointer(rules(after=160), FRAME_MS)
    assert ep.update([_] * 100) is None


def test_max_utterance_cuts_continuous_speech() -> None:
    ep = Endpointer(rules(after=800, max_ms=30_000), FRAME_MS)  # 375 frames
    assert ep.update([S] * 374) is None
    assert ep.update([S]) == 374
    assert ep.fired is EndpointRule.MAX_UTTERANCE
    assert ep.utterance_start == 375


def test_max_utterance_counts_leading_silence_when_the_silence_rule_is_off() -> None:
    ep = Endpointer(rules(max_ms=800), FRAME_MS)
    assert ep.update([_] * 9 + [S]) == 9
    assert ep.fired is EndpointRule.MAX_UTTERANCE


def test_silence_rule_wins_over_max_utterance_on_the_same_frame() -> None:
    ep = Endpointer(rules(after=160, max_ms=400), FRAME_MS)  # 2 and 5 frames
    assert ep.update([S, S, S, _, _]) == 4
    assert ep.fired is EndpointRule.SILENCE_AFTER_SPEECH


def test_disabled_rules_never_fire() -> None:
    ep = Endpointer(rules(), FRAME_MS)
    assert ep.update([S] * 1000 + [_] * 1000) is None
    assert ep.fired is None
    assert ep.utterance_frames == 2000


def test_update_stops_at_the_endpoint_and_leaves_the_rest() -> None:
    ep = Endpointer(rules(after=160), FRAME_MS)  # 2 frames
    assert ep.update([S, _, _, S, S, S]) == 2
    assert ep.position == 3
    assert ep.update([]) is None
    assert ep.fired is None
    assert ep.position == 3


def test_documented_loop_finds_every_endpoint_in_one_chunk() -> None:
    ep = Endpointer(rules(after=160, without=240), FRAME_MS)
    flags = [S, _, _, _, _, _, S, S, _, _, S]
    assert all_endpoints(ep, flags) == [
        (2, EndpointRule.SILENCE_AFTER_SPEECH),
        (5, EndpointRule.SILENCE_WITHOUT_SPEECH),
        (9, EndpointRule.SILENCE_AFTER_SPEECH),
    ]
    assert ep.position == len(flags)
    assert ep.utterance_start == 10 and ep.speech


@pytest.mark.parametrize("seed", range(20))
def test_chunking_does_not_change_the_endpoints(seed: int) -> None:
    rng = random.Random(seed)
    flags = [rng.random() < 0.15 for _ in range(3000)]
    config = rules(after=rng.choice([0, 160, 800]), without=rng.choice([0, 400, 2000]),
                   max_ms=rng.choice([0, 1600, 30_000]))
    frame_by_frame = Endpointer(config, FRAME_MS)
    expected = [found for flag in flags for found in all_endpoints(frame_by_frame, [flag])]
    chunked = Endpointer(config, FRAME_MS)
    got, i = [], 0
    while i < len(flags):
        n = rng.randint(1, 20)
        got += all_endpoints(chunked, flags[i:i + n])
        i += n
    assert got == expected
    assert chunked.position == frame_by_frame.position == len(flags)


def test_reset_starts_a_new_utterance_at_the_current_position() -> None:
    ep = Endpointer(rules(after=400, max_ms=800), FRAME_MS)
    ep.update([S, S, _, _])
    ep.reset()
    assert (ep.position, ep.utterance_start, ep.trailing_silence, ep.speech) == (4, 4, 0, False)
    assert ep.utterance_frames == 0
    # The max-length rule counts from the reset, not from the stream start.
    assert ep.update([S] * 9) is None
    assert ep.update([S]) == 13


def test_frame_ms_scales_the_limits() -> None:
    ep = Endpointer(rules(after=800), frame_ms=40)  # 20 frames
    assert ep.update([S] + [_] * 19) is None
    assert ep.update([_]) == 20
    with pytest.raises(ValueError, match="frame_ms"):
        Endpointer(rules(), frame_ms=0)


def test_default_rules() -> None:
    ep = Endpointer(EndpointingConfig(), FRAME_MS)
    assert ep.update([S] + [_] * 9) is None
    assert ep.update([_]) == 10  # 800 ms of silence after speech
    assert ep.update([_] * 62) is None
    assert ep.update([_]) == 73  # 5000 ms of silence -> 63 frames
    assert ep.update([S] * 374) is None
    assert ep.update([S]) == 448  # 30 s -> 375 frames


def test_rule_values_are_the_metric_labels() -> None:
    assert {rule.value for rule in EndpointRule} == set(ENDPOINT_RULES)
