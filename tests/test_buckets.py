"""Batch-size buckets: padding rules and the cover a migration prepares."""
from __future__ import annotations

from streamd.buckets import MAX_PADDING, NEAR_PADDING, PAD_ROWS, bucket_size, cover, padded_bucket


def test_a_batch_replays_a_bucket_of_at_most_twice_its_rows_or_pad_rows() -> None:
    assert padded_bucket(3, [PAD_ROWS, 64]) == PAD_ROWS  # a few rows: any bucket up to PAD_ROWS
    assert padded_bucket(3, [PAD_ROWS + 1]) is None
    assert padded_bucket(40, [64, 80, 81]) == 64
    assert padded_bucket(40, [81]) is None  # more than MAX_PADDING x 40
    assert padded_bucket(40, [50, 64], near=True) == 50
    assert padded_bucket(40, [51, 64], near=True) is None  # more than NEAR_PADDING x 40
    assert padded_bucket(40, [30, 39]) is None  # never fewer rows


def test_a_cover_leaves_every_size_a_near_bucket_with_the_fewest_graphs() -> None:
    sizes = [bucket_size(b) for b in (1, 2, 3, 20, 40, 48, 56, 64, 72, 80, 96, 112, 128, 512, 576, 640)]
    picked = cover(sizes)
    assert picked == [640, 128, 96, 72, 56, 40, 20]
    assert all(padded_bucket(b, picked, near=True) is not None for b in sizes)
    assert cover(sizes, taken=[640, 128]) == [96, 72, 56, 40, 20]  # 512-640 and 112-128 have theirs
    assert cover([]) == [] and cover([5], taken=[PAD_ROWS]) == []
    assert 1 < NEAR_PADDING < MAX_PADDING
