"""Word 6-grams and the reserved-sentence filter (shared/data/recipe.md's hashing rule)."""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

N = 6


def words(text: str) -> list[str]:
    """Lowercased words; everything but a-z and apostrophes separates words."""
    return re.sub(r"[^a-z']", " ", text.lower()).split()


def ngrams(text: str, n: int = N) -> list[str]:
    """The word n-grams of a text, each joined by one space."""
    w = words(text)
    return [" ".join(w[i:i + n]) for i in range(len(w) - n + 1)]


def ngram_hash(ngram: str) -> str:
    """First 16 hex digits of the sha1 of an n-gram."""
    return hashlib.sha1(ngram.encode()).hexdigest()[:16]


def hashes(text: str, n: int = N) -> set[str]:
    """Hashes of every word n-gram of a text."""
    return {ngram_hash(g) for g in ngrams(text, n)}


def load_reserved(path: Path) -> frozenset[str]:
    """The reserved hashes, one a line."""
    return frozenset(line.strip().lower() for line in path.read_text().splitlines() if line.strip())


def shares_ngram(texts: Iterable[str], reserved: frozenset[str] | set[str]) -> bool:
    """Whether any of the texts (say a raw sentence and its normalised form) has a reserved n-gram."""
    return any(not hashes(t).isdisjoint(reserved) for t in texts)
