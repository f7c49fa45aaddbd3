"""Transcripts as text, JSON lines, SRT or WebVTT.

Subtitle cues are built from the finals' word times (the file client asks for ``word_times``):
an utterance longer than ``MAX_CUE_CHARS`` characters or ``MAX_CUE_S`` seconds is split between
words into several cues, each wrapped to lines of at most ``LINE_CHARS`` characters.
"""
from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from streamd.protocol import Final, Word

FORMATS = ("text", "jsonl", "srt", "vtt")
EXTENSIONS = {"text": "txt", "jsonl": "jsonl", "srt": "srt", "vtt": "vtt"}
LINE_CHARS = 42
MAX_CUE_CHARS = 2 * LINE_CHARS
MAX_CUE_S = 7.0
MIN_CUE_S = 0.08  # one encoder frame: a cue never ends before it starts


@dataclass(frozen=True)
class Transcript:
    """What a file produced: its finals, and the error that stopped it if one did (the finals
    are then those received before it)."""

    file: str
    duration: float
    finals: Sequence[Final] = ()
    error: str | None = None

    @property
    def text(self) -> str:
        return " ".join(f.text for f in self.finals if f.text)


@dataclass(frozen=True)
class Cue:
    start: float
    end: float
    text: str


def cues(finals: Sequence[Final]) -> list[Cue]:
    """Subtitle cues: one per utterance, split between words when too long, not overlapping."""
    out: list[Cue] = []
    for final in finals:
        if not final.text:
            continue
        words = final.words or (Word(final.text, final.start, final.end),)
        group: list[Word] = []
        for w in words:
            longer = " ".join(x.word for x in (*group, w))
            if group and (len(longer) > MAX_CUE_CHARS or w.end - group[0].start > MAX_CUE_S):
                out.append(_cue(group))
                group = []
            group.append(w)
        out.append(_cue(group))
    return _no_overlap(out)


def _no_overlap(cues: list[Cue]) -> list[Cue]:
    """End each cue where the next one starts (a word may end after the next one began)."""
    for i, (cue, following) in enumerate(zip(cues, cues[1:])):
        if cue.end > following.start > cue.start:
            cues[i] = Cue(cue.start, following.start, cue.text)
    return cues


def _cue(words: Sequence[Word]) -> Cue:
    start = words[0].start
    text = "\n".join(textwrap.wrap(" ".join(w.word for w in words), LINE_CHARS))
    return Cue(start, max(words[-1].end, start + MIN_CUE_S), text)


def _timestamp(seconds: float, separator: str) -> str:
    ms = round(seconds * 1000)
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    return f"{hours:02d}:{minutes:02d}:{rest // 1000:02d}{separator}{rest % 1000:03d}"


def srt(finals: Sequence[Final]) -> str:
    """SubRip: numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``, a blank line after each."""
    return "".join(f"{i}\n{_timestamp(c.start, ',')} --> {_timestamp(c.end, ',')}\n{c.text}\n\n"
                   for i, c in enumerate(cues(finals), 1))


def vtt(finals: Sequence[Final]) -> str:
    """WebVTT: the ``WEBVTT`` header, then cues with ``HH:MM:SS.mmm`` times."""
    return "WEBVTT\n\n" + "".join(f"{_timestamp(c.start, '.')} --> {_timestamp(c.end, '.')}\n{c.text}\n\n"
                                  for c in cues(finals))


def jsonl(t: Transcript) -> str:
    """One JSON object: file, text, duration, utterances; and error if the file failed (text and
    utterances are then what came before it)."""
    if t.error is not None and not t.finals:
        return json.dumps({"file": t.file, "error": t.error}, ensure_ascii=False) + "\n"
    utterances = [{"text": f.text, "start": f.start, "end": f.end, "reason": f.reason} for f in t.finals if f.text]
    line = {"file": t.file, "text": t.text, "duration": round(t.duration, 3), "utterances": utterances}
    return json.dumps(line if t.error is None else {**line, "error": t.error}, ensure_ascii=False) + "\n"


def plain_text(t: Transcript, named: bool) -> str:
    """Plain text: one line per utterance; ``named`` starts each with the file name (and gives a
    file without words a line of its own name)."""
    lines = [f.text for f in t.finals if f.text]
    if named:
        return "".join(f"{t.file}: {line}\n" for line in lines) or f"{t.file}:\n"
    return "".join(line + "\n" for line in lines)


def render(t: Transcript, fmt: str, named: bool) -> str:
    """``t`` in format ``fmt``; ``named`` prefixes plain text with the file name."""
    if fmt == "jsonl":
        return jsonl(t)
    if fmt == "text":
        return plain_text(t, named)
    return srt(t.finals) if fmt == "srt" else vtt(t.finals)
