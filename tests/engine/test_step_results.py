"""`StepResults`: a step's results as arrays, and the `ChunkResult` of each row."""
from __future__ import annotations

import numpy as np

from streamd.engine.types import ChunkResult, StepResults


def results(labels: list[list[int]], start: list[int], end: list[int]) -> StepResults:
    """Rows of the given labels (times: label * 10), padded with -1 to the widest."""
    width = max((len(r) for r in labels), default=0)
    padded = np.array([r + [-1] * (width - len(r)) for r in labels], np.int64).reshape(len(labels), width)
    return StepResults(padded, padded * 10, np.array([len(r) for r in labels], np.int64),
                       np.array(start, np.int64), np.array(end, np.int64))


def test_each_row_is_its_streams_chunk_result() -> None:
    r = results([[4, 5], [], [6]], [0, 3, 7], [2, 5, 9])
    expected = [ChunkResult([4, 5], [40, 50], 0, 2), ChunkResult([], [], 3, 5), ChunkResult([6], [60], 7, 9)]
    assert r.chunks() == expected and len(r) == 3


def test_rows_are_picked_in_order_and_trimmed_to_the_columns_they_use() -> None:
    r = results([[4, 5], [], [6]], [0, 3, 7], [2, 5, 9])
    picked = r.rows(np.array([2, 1], np.int64))
    assert picked.labels.shape == (2, 1)
    assert picked.chunks() == [ChunkResult([6], [60], 7, 9), ChunkResult([], [], 3, 5)]
    assert r.rows(np.array([1], np.int64)).chunks() == [ChunkResult([], [], 3, 5)]
    assert r.rows(np.zeros(0, np.int64)).chunks() == []


def test_parts_of_different_widths_join_row_after_row() -> None:
    a, b = results([[1], []], [0, 0], [2, 2]), results([[2, 3, 4]], [5], [6])
    joined = StepResults.joined([a, b])
    assert joined.chunks() == a.chunks() + b.chunks()
    assert StepResults.joined([a]) is a
    assert len(StepResults.joined([])) == 0 and StepResults.joined([]).chunks() == []
