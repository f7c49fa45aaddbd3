"""Text normalisation for scoring and word error rate (word-level Levenshtein distance)."""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_WORD = re.compile(r"[a-z']+")


def normalize(text: str) -> str:
    """Lowercase, keep a-z and apostrophes inside words, single spaces (the labels' alphabet)."""
    words = (w.strip("'") for w in _WORD.findall(text.lower()))
    return " ".join(w for w in words if w)


def edit_distance(ref: Sequence[str], hyp: Sequence[str]) -> int:
    """Minimum substitutions + deletions + insertions turning ref into hyp."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def word_errors(ref: str, hyp: str) -> tuple[int, int]:
    """(errors, reference words) after normalising both sides."""
    r, h = normalize(ref).split(), normalize(hyp).split()
    return edit_distance(r, h), len(r)


def wer(pairs: Iterable[tuple[str, str]]) -> float:
    """Corpus WER in percent over (reference, hypothesis) pairs: total errors / total ref words."""
    errors = words = 0
    for ref, hyp in pairs:
        e, n = word_errors(ref, hyp)
        errors += e
        words += n
    return 100.0 * errors / max(words, 1)
