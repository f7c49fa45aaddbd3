"""Endpoint detection from the decoder's per-encoder-frame outcome.

Kaldi/sherpa-style rules, OR-ed, evaluated after every encoder frame (80 ms for the models
streamd runs; the caller passes the model's, `ChunkGeometry.frame_ms`).
A frame is *speech* when the decoder emitted at least one non-blank token on
it and *silence* otherwise; trailing silence counts the blank frames since the
utterance's last speech frame (or since its start).

- ``silence_after_speech_ms``: the utterance has speech and its trailing
  silence reached the limit; the utterance is final.
- ``silence_without_speech_ms``: the utterance has no speech yet and has
  lasted the limit; it is discarded (no final is sent).
- ``max_utterance_ms``: the utterance reached the limit; it is cut there.

Limits are rounded up to whole frames; 0 disables a rule. The session sends a
final only for utterances that produced tokens (see ``docs/protocol.md``).
"""
from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from streamd.config import EndpointingConfig


class EndpointRule(enum.Enum):
    """Which rule ended an utterance; values are stable metric label values."""

    SILENCE_AFTER_SPEECH = "silence_after_speech"
    SILENCE_WITHOUT_SPEECH = "silence_without_speech"
    MAX_UTTERANCE = "max_utterance"


def _frames(ms: int, frame_ms: float) -> int:
    return math.ceil(ms / frame_ms)


@dataclass
class Endpointer:
    """Per-stream endpoint state. Frame indices are absolute: 0 is the stream's first frame.

    Use it after each decode step with that step's per-frame flags; ``update``
    stops at an endpoint, so feed it the unconsumed rest until it returns None::

        first = ep.position
        while (end := ep.update(flags[ep.position - first:])) is not None:
            close_utterance(last_frame=end, rule=ep.fired)

    Attributes:
        position: frames consumed so far (the absolute index of the next frame).
        utterance_start: absolute index of the current utterance's first frame.
        trailing_silence: blank frames at the end of the current utterance.
        speech: whether the current utterance has a speech frame.
        fired: the rule behind the last endpoint ``update`` returned, else None.
    """

    rules: EndpointingConfig
    frame_ms: float  # milliseconds per encoder frame
    position: int = field(default=0, init=False)
    utterance_start: int = field(default=0, init=False)
    trailing_silence: int = field(default=0, init=False)
    speech: bool = field(default=False, init=False)
    fired: EndpointRule | None = field(default=None, init=False)
    _after_speech: int = field(init=False, repr=False)
    _without_speech: int = field(init=False, repr=False)
    _max_frames: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.frame_ms <= 0:
            raise ValueError(f"frame_ms must be positive, got {self.frame_ms}")
        self._after_speech = _frames(self.rules.silence_after_speech_ms, self.frame_ms)
        self._without_speech = _frames(self.rules.silence_without_speech_ms, self.frame_ms)
        self._max_frames = _frames(self.rules.max_utterance_ms, self.frame_ms)

    @property
    def utterance_frames(self) -> int:
        """Length of the current utterance in frames."""
        return self.position - self.utterance_start

    def update(self, frames_emitted: Sequence[bool]) -> int | None:
        """Consume frames up to the first endpoint.

        Args:
            frames_emitted: one flag per encoder frame, in order; True when the
                decoder emitted a non-blank token on that frame.

        Returns:
            The absolute index of the last frame of the utterance that just
            ended (the next utterance starts at ``end + 1``), or None when no
            rule fired; frames after the endpoint are not consumed.
        """
        self.fired = None
        for emitted in frames_emitted:
            self.position += 1
            if emitted:
                self.speech = True
                self.trailing_silence = 0
            else:
                self.trailing_silence += 1
            rule = self._rule()
            if rule is not None:
                self.fired = rule
                end = self.position - 1
                self.reset()
                return end
        return None

    def reset(self) -> None:
        """Start a new utterance at ``position`` (after a finalize or an endpoint)."""
        self.utterance_start = self.position
        self.trailing_silence = 0
        self.speech = False

    def _rule(self) -> EndpointRule | None:
        if self.speech:
            if self._after_speech and self.trailing_silence >= self._after_speech:
                return EndpointRule.SILENCE_AFTER_SPEECH
        elif self._without_speech and self.trailing_silence >= self._without_speech:
            return EndpointRule.SILENCE_WITHOUT_SPEECH
        if self._max_frames and self.utterance_frames >= self._max_frames:
            return EndpointRule.MAX_UTTERANCE
        return None
