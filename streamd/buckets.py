"""Batch-size buckets for CUDA graphs: a graph is captured per bucket, and a batch runs in the
smallest bucket that holds it, padded."""
from __future__ import annotations

from collections.abc import Iterable

DEFAULT_PER_OCTAVE = 8
# A batch whose own bucket has no graph yet, at a time it may not capture one (a capture on the
# engine thread stalls every stream's results), replays the smallest captured bucket of at most
# this many times its rows, padded (`padded_bucket`): the padding costs GPU time; the alternatives,
# an eager call (every kernel launched from Python on the engine thread) or the capture, cost more
# of the engine thread's time. After a move whose target steps smaller batches than its source,
# most encoder calls ran eagerly for seconds on an H100.
MAX_PADDING = 2.0


def bucket_size(b: int, per_octave: int = DEFAULT_PER_OCTAVE) -> int:
    """The smallest bucket >= b (b >= 1): powers of two up to `per_octave` (a power of two), then
    `per_octave` evenly spaced sizes per octave, e.g. with 8: ... 8, 9, ..., 16, 18, ..., 32,
    36, ..., 2048, 2304, 2560, ... The padding is less than b / per_octave."""
    if b <= per_octave:
        return 1 << (b - 1).bit_length()
    step = (1 << ((b - 1).bit_length() - 1)) // per_octave
    return -(-b // step) * step


def check_per_octave(per_octave: int) -> None:
    if per_octave < 1 or per_octave & (per_octave - 1):
        raise ValueError(f"per_octave must be a power of two, not {per_octave}")


def padded_bucket(b: int, captured: Iterable[int]) -> int | None:
    """The smallest of the `captured` bucket sizes that holds b rows with at most `MAX_PADDING` x b
    (None: none)."""
    return min((size for size in captured if b <= size <= MAX_PADDING * b), default=None)
