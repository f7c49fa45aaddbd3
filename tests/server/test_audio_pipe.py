"""The front end's audio pipe: a one-way ring of bytes in shared memory (`server/audio_pipe.py`)."""
from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from streamd.server.audio_pipe import ALIGN, AudioPipe


def pieces(*sizes: int, start: float = 0.0) -> list[np.ndarray]:
    out, at = [], start
    for n in sizes:
        out.append(np.arange(at, at + n, dtype=np.float32))
        at += n
    return out


def test_a_message_is_read_back_where_it_was_put_one_piece_after_another() -> None:
    pipe = AudioPipe.create(4096)
    sent = pieces(3, 0, 5)
    put = pipe.put(sent)
    assert put is not None
    at, end = put
    np.testing.assert_array_equal(pipe.view(at, 8), np.concatenate(sent))
    assert at % ALIGN == 0 and end == ALIGN  # 32 bytes take one aligned span


def test_the_writer_waits_for_the_reader_then_wraps_to_the_start() -> None:
    pipe = AudioPipe.create(1024)
    first = pipe.put(pieces(100))  # 400 bytes: span 448
    second = pipe.put(pieces(100, start=100.0))  # 448 more: 896 of 1024 used
    assert first is not None and second is not None
    assert pipe.put(pieces(40)) is None  # 160 bytes: the 128 left at the end are too few, the start is not free
    np.testing.assert_array_equal(pipe.view(*first[:1], 100), np.arange(100, dtype=np.float32))
    pipe.free(first[1])  # the reader took the first message
    third = pipe.put(pieces(40, start=7.0))
    assert third is not None and third[0] == 0  # skipped the end's 128 bytes, starts again at 0
    np.testing.assert_array_equal(pipe.view(*second[:1], 100), np.arange(100, 200, dtype=np.float32))  # intact
    np.testing.assert_array_equal(pipe.view(third[0], 40), np.arange(7, 47, dtype=np.float32))
    pipe.free(second[1])
    pipe.free(third[1])
    assert pipe.put(pieces(128)) is not None  # all free again: half the pipe fits


def test_a_message_larger_than_half_the_pipe_never_goes_through_it() -> None:
    pipe = AudioPipe.create(1024)
    assert pipe.put(pieces(129)) is None  # 516 bytes > 512
    assert pipe.put(pieces(128)) is not None


def test_the_capacity_keeps_every_message_aligned() -> None:
    with pytest.raises(ValueError, match="multiple of 64"):
        AudioPipe.create(1000)


def _child_reads_and_writes(pipe: AudioPipe, at: int, n: int, out: multiprocessing.queues.Queue) -> None:  # type: ignore[name-defined]
    out.put(pipe.view(at, n).tolist())
    out.put(pipe.put(pieces(4, start=50.0)))


def test_a_spawned_process_maps_the_same_memory() -> None:
    """As a front end gets its pipe: in its spawn spec (the memory's descriptor is passed)."""
    ctx = multiprocessing.get_context("spawn")
    writer = AudioPipe.create(4096)
    first = writer.put(pieces(3, start=1.0))
    assert first is not None
    out = ctx.Queue()
    child = ctx.Process(target=_child_reads_and_writes, args=(writer, first[0], 3, out))
    child.start()
    writer.close()  # as the daemon does once the child started: the mapping stays
    assert out.get(timeout=60) == [1.0, 2.0, 3.0]
    at, _ = out.get(timeout=10)  # the child's own counter: it wrote at its start, 0
    child.join(10)
    np.testing.assert_array_equal(writer.view(at, 4), [50.0, 51.0, 52.0, 53.0])


def test_without_memfd_an_unlinked_temporary_file_holds_the_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where `os.memfd_create` does not exist (not Linux) the pipe works the same."""
    monkeypatch.delattr("os.memfd_create")
    pipe = AudioPipe.create(1024)
    put = pipe.put(pieces(5))
    assert put is not None
    np.testing.assert_array_equal(pipe.view(put[0], 5), np.arange(5, dtype=np.float32))
    pipe.close()
