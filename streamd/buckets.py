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
# ... or of at most PAD_ROWS rows, whatever its own: a step of 1 to 32 rows costs about the same
# GPU time (7.2 ms for 1, 8.1 for 16, 11.2 for 64 at 1120 ms chunks on an H100), and a few late
# streams' steps came in every size from 1 up.
PAD_ROWS = 32
# A move's target is prepared with the graphs of a `cover` of the sizes serving called: each
# called size has one of at most NEAR_PADDING times its rows (or PAD_ROWS), and keeps replaying
# it padded instead of capturing its own on the engine thread (each capture there held every
# stream's results 0.7 s at 6000 streams on an H100; preparing every size took 90 s a move).
NEAR_PADDING = 1.25


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


def padded_bucket(b: int, captured: Iterable[int], near: bool = False) -> int | None:
    """The smallest of the `captured` bucket sizes that holds b rows with at most `MAX_PADDING`
    (`near`: `NEAR_PADDING`) x b rows, or `PAD_ROWS` (None: none)."""
    most = max((NEAR_PADDING if near else MAX_PADDING) * b, PAD_ROWS)
    return min((size for size in captured if b <= size <= most), default=None)


def cover(sizes: Iterable[int], taken: Iterable[int] = ()) -> list[int]:
    """The fewest of `sizes` (largest first) whose graphs, with those of the sizes `taken`, leave
    every one of `sizes` a near one (`padded_bucket(near=True)`)."""
    had = list(taken)
    picked: list[int] = []
    for b in sorted(set(sizes), reverse=True):
        if padded_bucket(b, had + picked, near=True) is None:
            picked.append(b)
    return picked
