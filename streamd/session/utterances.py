"""Cut a stream's token sequence into utterances: partial and final results.

Decoding is continuous across the utterances of one segment (an endpoint does not reset the
decoder state; a `finalize` starts a new segment, with its own engine stream), so the tokens of
a segment's utterances, concatenated, are what `streamd decode --streaming` gives for the
segment's audio, less what the speech gate drops (`StreamSession`). Endpointing only decides
where one utterance ends and the next begins.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from streamd.config import EndpointingConfig
from streamd.session.endpoint import Endpointer, EndpointRule
from streamd.engine.types import ChunkResult

REASONS = {EndpointRule.SILENCE_AFTER_SPEECH: "endpoint", EndpointRule.MAX_UTTERANCE: "max_utterance"}


@dataclass
class Utterance:
    """Tokens (ids) and their encoder-frame times; frames [start, end) the utterance spans."""

    index: int
    tokens: list[int]
    times: list[int]
    start: int
    end: int
    reason: str = ""
    final: bool = False


@dataclass
class UtteranceTracker:
    """Cuts one segment's chunk results into utterances by `rules`, at `frame_ms` per encoder frame;
    `on_endpoint` hears the rule of every endpoint (the metric)."""

    rules: EndpointingConfig
    frame_ms: float
    index: int = 0
    on_endpoint: Callable[[EndpointRule], None] | None = None
    tokens: list[int] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    endpointer: Endpointer = field(init=False)

    def __post_init__(self) -> None:
        self.endpointer = Endpointer(self.rules, self.frame_ms)

    @property
    def start(self) -> int:
        return self.endpointer.utterance_start

    def on_chunk(self, result: ChunkResult) -> list[Utterance]:
        """Finals closed by endpoints inside this chunk, then the open utterance as a partial
        (only if it has tokens)."""
        self.tokens += result.tokens
        self.times += result.times
        emitted = set(result.times)
        flags = [t in emitted for t in range(result.frame_start, result.frame_end)]
        out: list[Utterance] = []
        while True:
            start = self.start  # `update` resets it when an endpoint fires
            end = self.endpointer.update(flags[self.endpointer.position - result.frame_start:])
            if end is None:
                break
            rule = self.endpointer.fired
            if rule is not None and self.on_endpoint is not None:
                self.on_endpoint(rule)
            closed = self._cut(start, end + 1, REASONS.get(rule, "endpoint") if rule else "endpoint")
            if closed is not None:
                out.append(closed)
        if self.tokens:
            out.append(Utterance(self.index, list(self.tokens), list(self.times), self.start, result.frame_end))
        return out

    def close(self, reason: str, end_frame: int) -> Utterance:
        """Close the open utterance (finalize or end of stream); always a final, possibly
        without tokens, so that a client's finalize or stop is always answered."""
        closed = self._cut(self.start, end_frame, reason, keep_empty=True)
        assert closed is not None
        self.endpointer.position = max(self.endpointer.position, end_frame)
        self.endpointer.reset()
        return closed

    def _cut(self, start: int, end: int, reason: str, keep_empty: bool = False) -> Utterance | None:
        n = sum(1 for t in self.times if t < end)
        toks, times = self.tokens[:n], self.times[:n]
        self.tokens, self.times = self.tokens[n:], self.times[n:]
        if not toks and not keep_empty:
            return None
        u = Utterance(self.index, toks, times, start, end, reason, final=True)
        self.index += 1
        return u
