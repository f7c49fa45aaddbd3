"""The front end's audio pipe: a one-way ring of bytes in shared memory (`server/audio_pipe.py`)."""
from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from streamd.server.audio_pipe import ALIGN, RUN_SHARE, AudioPipe, runs
from streamd.server.link import SharedAudio, StreamAudio
from streamd.server.metrics import Metrics
from streamd.server.worker import RemoteEngine


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


def test_runs_cut_queued_pieces_in_order_at_a_share_of_the_pipe() -> None:
    share = 4096 // RUN_SHARE  # 512 bytes: 128 samples
    assert runs([], 4096) == []
    assert runs([100, 28, 1, 200, 50, 60], 4096) == [(0, 2), (2, 3), (3, 4), (4, 6)]  # 200 alone: larger than a run
    assert all(4 * sum([100, 28, 1, 200, 50, 60][a:b]) <= share or b - a == 1
               for a, b in runs([100, 28, 1, 200, 50, 60], 4096))


class _State:
    def __init__(self) -> None:
        self.metrics = Metrics(process=False)


def test_a_late_flush_larger_than_half_the_pipe_still_goes_through_it() -> None:
    """A front end whose event loop woke late has more audio queued than one message of the pipe
    takes: it leaves in runs, each in the pipe, in order; only a run the pipe has no room for
    goes in its message."""
    remote = RemoteEngine(None, AudioPipe.create(4096), None)  # type: ignore[arg-type]
    remote._state = _State()  # type: ignore[assignment]
    sent = pieces(*([50] * 12))  # 2400 bytes queued: more than half of 4096
    remote._audio = [(i % 3, p) for i, p in enumerate(sent)]
    messages = remote._audio_messages()
    assert all(isinstance(m, SharedAudio) for m in messages) and len(messages) == 6  # 2 pieces (400 bytes) a run
    assert [i for m in messages for i in m.stream_ids] == [i % 3 for i in range(12)]
    got = np.concatenate([remote.audio.view(m.at, sum(m.sizes)) for m in messages])
    np.testing.assert_array_equal(got, np.concatenate(sent))
    # the reader took none of it: of 6 more runs, those the pipe has no room for go inline, in order
    remote._audio = [(7, p) for p in pieces(*([50] * 12), start=1000.0)]
    later = remote._audio_messages()
    assert [type(m) for m in later] == [SharedAudio] * 3 + [StreamAudio] * 3  # 6 x 448 bytes used, 3 more fit
    inline = np.concatenate([m.samples for m in later if isinstance(m, StreamAudio)])
    np.testing.assert_array_equal(inline, np.arange(1300, 1600, dtype=np.float32))
    counted = remote._state.metrics.audio_messages  # type: ignore[union-attr]
    assert counted.labels(path="shared")._value.get() == 9 and counted.labels(path="inline")._value.get() == 3
