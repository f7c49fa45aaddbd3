"""One stream's conversation, without sockets, threads or timers (the Sans-I/O style).

`StreamSession` takes what the client sent (`receive`, or `begin`/`feed`/`finalize`/`end` for
another protocol face) and what the engine returned (`receive_result`, `segment_flushed`). It
answers with the messages to send (returned) and queues the engine commands to run (`commands`:
`Open`, `Push`, `End`, in order). It owns the protocol state, the segments (`finalize` ends one
engine stream and opens the next, so the utterance it closes holds all audio sent before it),
utterances and endpointing, the time base (encoder frames to stream seconds), partial
de-duplication and word times. The caller (`server/handler.py`) owns the I/O: the socket,
timeouts, engine slots and back-pressure.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, cast

from streamd import protocol as p
from streamd.audio.activity import Activity, ActivityBatch
from streamd.audio.pcm import PcmDecoder, Samples
from streamd.config import EndpointingConfig, GateConfig
from streamd.engine.types import ChunkGeometry, ChunkResult
from streamd.model.tokenizer import Tokenizer
from streamd.session.endpoint import EndpointRule
from streamd.session.utterances import Utterance, UtteranceTracker

# Why a segment ended: its open utterance's final says so; `clear` (a realtime face) drops its results.
SegmentEnd = Literal["finalize", "end_of_stream", "clear"]
Result = p.Partial | p.Final
# The speech gate keeps a word whose encoder frame lies this close to audio that may hold speech:
# a word comes out up to about a second after its audio, or before it by up to the lookahead.
GATE_BEFORE_S = 1.0
GATE_AFTER_S = 1.2


@dataclass(eq=False)
class Segment:
    """One engine stream of the session, starting `offset_s` seconds into the stream."""

    offset_s: float
    end_reason: SegmentEnd = "end_of_stream"
    frame_end: int = 0  # encoder frames of it decoded so far


@dataclass(frozen=True)
class Open:
    """Open an engine stream for `segment`. `after`: the segment a `finalize` just ended; a full
    engine frees that one's slot for it (a stream never needs two)."""

    segment: Segment
    after: Segment | None = None


@dataclass(frozen=True)
class Push:
    """Audio for `segment`'s engine stream: float32 mono at the model's rate."""

    segment: Segment
    samples: Samples


@dataclass(frozen=True)
class End:
    """No more audio for `segment`: flush it. `last`: no segment follows (the stream ended)."""

    segment: Segment
    last: bool = False


Command = Open | Push | End


@dataclass
class _SettledWords:
    """The open utterance's words that no later token can change: those of its first
    `len(tokens)` tokens (whole words, ending within the audio received), for `open_words` to
    decode only the rest."""

    tracker: UtteranceTracker | None = None
    index: int = -1  # the tracker's utterance
    tokens: list[int] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    words: tuple[p.Word, ...] = ()


class StreamSession:
    """The protocol and result state of one stream.

    Args:
        geometry: the model's time base (its sample rate and encoder frame).
        tokenizer: token ids to text, pieces and words.
        endpointing: the server's endpoint rules, which ``start`` may override.
        on_endpoint: hears the rule of every endpoint (the metric).
        gate: the speech gate (``streamd.audio.activity``): tokens far from audio that may hold
            speech are dropped, as if the model had not emitted them. None: off.
        utterance_limit_ms: the longest utterance whatever ``start`` asks (None: no limit), so that
            no result (and no message) grows without bound.
        gate_batch: the streams whose gate analysis this one's joins (one thread's: a process's
            sessions, `StreamContext.gates`); None: its own.
    """

    def __init__(self, geometry: ChunkGeometry, tokenizer: Tokenizer, endpointing: EndpointingConfig,
                 on_endpoint: Callable[[EndpointRule], None] | None = None, gate: GateConfig | None = None,
                 utterance_limit_ms: int | None = None, gate_batch: ActivityBatch | None = None) -> None:
        self.proto = p.SessionProtocol()
        self.utterance_limit_ms = utterance_limit_ms
        self.tokenizer, self.on_endpoint = tokenizer, on_endpoint
        self.rate, self.frame_s, self.frame_ms = geometry.sample_rate, geometry.frame_seconds, geometry.frame_ms
        self.start: p.Start | None = None
        self.rules = endpointing  # the stream's, once started
        self.segment: Segment | None = None  # the one audio goes to; None before start and after the end
        self.samples_in = 0  # samples at the model's rate handed to the engine
        self.decoded_s = 0.0  # stream time up to which results have come back
        self.utterances = 0  # index after the last final
        self.partials = 0  # partials sent
        self._partial = (-1, 0, "")  # (utterance, tokens, text) of the open utterance at the last partial asked
        self._pcm: PcmDecoder | None = None
        self._commands: list[Command] = []
        self._tracker: tuple[Segment, UtteranceTracker] | None = None  # of the segment whose results come in
        self._next_utterance = 0  # the first utterance index of the next segment
        self._settled = _SettledWords()  # of the open utterance, for `open_words`
        self.activity = (Activity(self.rate, gate.min_dbfs, gate.rise_db, gate_batch)
                         if gate is not None and gate.mode == "on" else None)

    @property
    def received_s(self) -> float:
        """Stream time of the audio received."""
        return self.samples_in / self.rate

    @property
    def backlog_s(self) -> float:
        """Seconds of audio received but not yet decoded."""
        return self.received_s - self.decoded_s

    def commands(self) -> list[Command]:
        """The engine commands queued since the last call, in the order to run them."""
        out, self._commands = self._commands, []
        return out

    # -- the client's side -----------------------------------------------------------------------
    def receive(self, data: str | bytes) -> p.ClientMessage | None:
        """Take one client message: text (parsed and returned) or audio (None).

        Raises:
            ProtocolViolation: a malformed message, or one not allowed now.
            UnsupportedAudio: ``start`` names an audio format streamd rejects.
        """
        if isinstance(data, bytes):
            self.proto.receive_audio()
            self.feed(data)
            return None
        message = self.proto.receive_text(data)
        if isinstance(message, p.Start):
            self.begin(message)
        elif isinstance(message, p.Finalize):
            self.finalize()
        elif isinstance(message, p.Stop):
            self.end()
        return message

    def begin(self, start: p.Start) -> None:
        """Start the stream with `start`'s format and options: its first segment opens at time 0."""
        self.start = start
        self.rules = start.endpointing.resolve(self.rules)
        if self.utterance_limit_ms is not None:
            self.rules = self.rules.capped(self.utterance_limit_ms)
        self._pcm = PcmDecoder(start.sample_rate, start.encoding, start.channels, model_rate=self.rate)
        self._open()

    def feed(self, audio: bytes) -> None:
        """PCM bytes of the started stream, of any size."""
        assert self._pcm is not None
        self._push(self._pcm.feed(audio))

    def finalize(self, reason: Literal["finalize", "clear"] = "finalize") -> None:
        """End the open segment and open the next. `finalize`: its open utterance becomes a final;
        `clear`: its results from now on are dropped."""
        assert self.segment is not None and self._pcm is not None
        if (tail := self._pcm.cut()).size:  # the resampler's held-back audio belongs to this segment
            self._push(tail)
        self.segment.end_reason = reason
        self._commands.append(End(self.segment))
        self._open(after=self.segment)

    def end(self) -> None:
        """The end of the audio (``stop``, or the server shutting down): flush the last segment."""
        assert self._pcm is not None
        self._push(self._pcm.flush())
        assert self.segment is not None
        self._commands.append(End(self.segment, last=True))
        self.segment = None

    def summary(self, reason: Literal["stop", "shutdown"], session_seconds: float) -> p.Summary:
        """The closing message of a stream that lasted `session_seconds`."""
        return p.Summary(self.utterances, self.partials, self.received_s, session_seconds, reason)

    def _open(self, after: Segment | None = None) -> None:
        self.segment = Segment(self.received_s)
        self._commands.append(Open(self.segment, after))

    def _push(self, samples: Samples) -> None:
        assert self.segment is not None
        self.samples_in += samples.size
        if self.activity is not None:
            self.activity.push(samples)
        self._commands.append(Push(self.segment, samples))

    # -- the engine's side -----------------------------------------------------------------------
    def receive_result(self, segment: Segment, result: ChunkResult) -> list[Result]:
        """One engine step's result for `segment` (segments report in order): the finals that
        endpoints closed in it, then the partial of the open utterance if its text changed."""
        tracker = self._tracking(segment)
        segment.frame_end = result.frame_end
        self.decoded_s = segment.offset_s + result.frame_end * self.frame_s
        result = self._gated(segment, result)
        return [m for u in tracker.on_chunk(result) if (m := self._message(u, segment)) is not None]

    def _gated(self, segment: Segment, result: ChunkResult) -> ChunkResult:
        """`result` without the tokens the speech gate drops."""
        if self.activity is None:
            return result
        activity = self.activity
        keep = [i for i, t in enumerate(result.times)
                if activity.active(self._seconds(segment, t) - GATE_BEFORE_S, self._seconds(segment, t + 1) + GATE_AFTER_S)]
        activity.forget(self.decoded_s - GATE_BEFORE_S)
        if len(keep) == len(result.tokens):
            return result
        return ChunkResult([result.tokens[i] for i in keep], [result.times[i] for i in keep],
                           result.frame_start, result.frame_end)

    def segment_flushed(self, segment: Segment) -> list[Result]:
        """All of `segment`'s results are in: the final of its open utterance. There is always
        one (without text if need be), so that a ``finalize`` or ``stop`` is always answered."""
        tracker = self._tracking(segment)
        closed = tracker.close(segment.end_reason, segment.frame_end)
        self._tracker, self._next_utterance = None, tracker.index
        message = self._message(closed, segment)
        return [] if message is None else [message]

    def open_words(self) -> tuple[p.Word, ...]:
        """The words of the open utterance as its latest partial says them, with stream times
        (for a face whose partials carry words; the native ``partial`` does not). A call per
        partial decodes only the words since the last call's settled ones (not the whole
        utterance again: that made a long utterance's partials quadratic)."""
        if self._tracker is None:
            return ()
        segment, tracker = self._tracker
        tokens, times, settled = tracker.tokens, tracker.times, self._settled
        n = len(settled.tokens)
        if (settled.tracker is not tracker or settled.index != tracker.index or tokens[:n] != settled.tokens
                or times[:n] != settled.times):
            settled = self._settled = _SettledWords(tracker, tracker.index)
            n = 0
        # Words before the last word start are whole; those ending within the audio received
        # keep their times (`_clipped` cannot cut them later).
        last = next((i for i in range(len(tokens) - 1, n, -1) if self.tokenizer.starts_word(tokens[i])), n)
        if last > n and self._seconds(segment, times[last - 1] + 1) <= self.received_s:
            settled.words += self._words(segment, tokens[n:last], times[n:last])
            settled.tokens, settled.times, n = tokens[:last], times[:last], last
        return settled.words + self._words(segment, tokens[n:], times[n:])

    def _words(self, segment: Segment, tokens: list[int], times: list[int]) -> tuple[p.Word, ...]:
        """The words of `tokens` with their times, never past the audio received."""
        return tuple(p.Word(w, round(self._clipped(segment, a), 3), round(self._clipped(segment, b + 1), 3))
                     for w, a, b in self.tokenizer.words(tokens, times))

    def _tracking(self, segment: Segment) -> UtteranceTracker:
        if self._tracker is None or self._tracker[0] is not segment:
            self._tracker = segment, UtteranceTracker(self.rules, self.frame_ms, self._next_utterance,
                                                      self.on_endpoint)
        return self._tracker[1]

    def _message(self, u: Utterance, segment: Segment) -> Result | None:
        """The message for utterance `u` of `segment`, if one is due; times in stream seconds."""
        assert self.start is not None
        if segment.end_reason == "clear":
            return None
        if not u.final:  # most steps add no token to the open utterance: its text is the same, nothing to send
            if not self.start.interim_results or self._partial[:2] == (u.index, len(u.tokens)):
                return None
        processed = min(self._seconds(segment, segment.frame_end), self.received_s)
        text = self.tokenizer.decode(u.tokens)
        # where its words begin and end (docs/protocol.md), as its word times say; without words,
        # the span it covers; never past the audio received
        first, last = (u.times[0], u.times[-1] + 1) if u.times else (u.start, u.end)
        start, end = self._clipped(segment, first), self._clipped(segment, last)
        if u.final:
            self.utterances = u.index + 1
            words = tokens = None
            if self.start.word_times:
                words = self._words(segment, u.tokens, u.times)
                tokens = tuple(self.tokenizer.id_to_piece(t) for t in u.tokens)
            return p.Final(u.index, text, start, end, processed, cast(p.FinalReason, u.reason), words, tokens)
        before, self._partial = self._partial, (u.index, len(u.tokens), text)  # an open utterance's tokens only grow
        if (before[0], before[2]) == (u.index, text):  # new tokens, no new text
            return None
        self.partials += 1
        return p.Partial(u.index, text, start, end, processed)

    def _seconds(self, segment: Segment, frame: int) -> float:
        """Stream time of encoder frame `frame` of `segment`."""
        return segment.offset_s + frame * self.frame_s

    def _clipped(self, segment: Segment, frame: int) -> float:
        """`_seconds`, at most the audio received (the last frame may reach into padding)."""
        return min(self._seconds(segment, frame), self.received_s)
