"""The unwinding of a failed CUDA graph capture, against a fake of torch's capture bookkeeping
(stream capture, device and pinned-host allocator recordings, pool references, the default
generator's capture mode) as torch 2.11 keeps it, and as torch 2.12 (which ends the allocators'
recordings itself) does. The real thing: tests/engine/test_migration_cuda.py on a GPU."""
from __future__ import annotations

import contextlib
import gc
import threading
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from streamd import cuda_capture

DEV = torch.device("cuda", 0)


class Stream:
    """torch's pool hands its streams out round-robin: the `POOL`-th new one is the first again."""

    POOL = 4
    made = 0

    def __init__(self) -> None:
        self.cuda_stream = Stream.made % Stream.POOL + 1  # 0 is the legacy default stream
        Stream.made += 1

    def wait_stream(self, other: Any) -> None:
        pass


class FakeTorch:
    """What `streamd.cuda_capture` calls of torch, with torch's capture state as plain fields."""

    def __init__(self, ends_recording_on_failure: bool = False) -> None:
        self.ends_recording_on_failure = ends_recording_on_failure  # torch >= 2.12
        self.default = object()
        self.current: Any = self.default
        self.capturing: dict[Any, str] = {}  # stream -> "active" | "invalidated"
        self.device_recording: dict[Any, Any] = {}  # pool -> graph
        self.host_recording: dict[Any, Any] = {}
        self.refs: Counter[Any] = Counter()  # the device allocator's use count of each pool
        self.generator_capturing = False
        self.handles = 0
        fake = self

        class Graph:
            def __init__(self, keep_graph: bool = False) -> None:
                self.stream: Any = None
                self.pool: Any = None
                self.ended = False

            def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
                fake.generator_capturing = True  # capture_prologue
                self.stream, self.pool = fake.current, pool
                fake.refs[pool] += 1
                for recording in (fake.device_recording, fake.host_recording):
                    if pool in recording:
                        raise RuntimeError("beginAllocateToPool: already recording to mempool_id")
                    recording[pool] = self
                fake.capturing[self.stream] = "active"

            def capture_end(self) -> None:
                if fake.current is not self.stream:
                    raise RuntimeError("Capture must end on the same stream it began on.")
                status = fake.capturing.pop(self.stream, None)
                if status is None:
                    raise RuntimeError("cudaErrorIllegalState")
                if status == "invalidated" and not fake.ends_recording_on_failure:
                    raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
                del fake.device_recording[self.pool], fake.host_recording[self.pool]
                if status == "invalidated":
                    fake.refs[self.pool] -= 1  # and reset gives the pool back
                    raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
                fake.generator_capturing = False  # capture_epilogue
                self.ended = True

            def reset(self) -> None:
                if self.ended:
                    fake.refs[self.pool] -= 1
                    self.ended = False

        @contextlib.contextmanager
        def stream(s: Any) -> Iterator[None]:
            before, fake.current = fake.current, s
            yield
            fake.current = before

        def end_allocate(device: int, pool: Any) -> None:
            if fake.device_recording.pop(pool, None) is None:
                raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

        def release(device: int, pool: Any) -> None:
            fake.refs[pool] -= 1
            assert fake.refs[pool] >= 0, "uc >= 0 INTERNAL ASSERT FAILED"

        def handle() -> tuple[int, int]:
            fake.handles += 1
            return (0, fake.handles)

        self.cuda = SimpleNamespace(
            device=lambda d: contextlib.nullcontext(), current_stream=lambda d=None: fake.current,
            set_stream=lambda s: setattr(fake, "current", s), stream=stream, Stream=lambda d=None: Stream(),
            is_current_stream_capturing=lambda: fake.current in fake.capturing, graph_pool_handle=handle,
            current_device=lambda: 0, CUDAGraph=Graph)
        self._C = SimpleNamespace(_cuda_endAllocateToPool=end_allocate, _cuda_releasePool=release)

    def zeros(self, *shape: int, device: Any = None) -> Any:
        return SimpleNamespace(add_=lambda x: None)

    def synchronize(self) -> None:
        """cudaDeviceSynchronize inside a capture: refused, and the capture invalidated."""
        if self.current in self.capturing:
            self.capturing[self.current] = "invalidated"
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    def random(self) -> None:
        """A random op outside capture (torch 2.11's CUDAGeneratorState::increase)."""
        if self.generator_capturing and self.current not in self.capturing:
            raise RuntimeError("Offset increment outside graph capture encountered unexpectedly.")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeTorch:
    return install(monkeypatch, FakeTorch())


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeTorch) -> FakeTorch:
    monkeypatch.setattr(cuda_capture, "torch", fake)
    monkeypatch.setattr(cuda_capture, "ABANDONED", [])
    monkeypatch.setattr(cuda_capture, "_LOCAL", threading.local())  # no private stream of the real torch
    monkeypatch.setattr(cuda_capture, "_TAKEN", {})
    monkeypatch.setattr(cuda_capture, "RESET_KEEPS_FAILED_POOLS", not fake.ends_recording_on_failure)
    return fake


def assert_clean(fake: FakeTorch, pool: cuda_capture.GraphPool, first: Any) -> None:
    assert fake.current is fake.default and not fake.capturing
    assert not fake.device_recording and not fake.generator_capturing
    assert all(n == 0 for n in fake.refs.values()), fake.refs  # every reference given back
    assert pool.handle != first and pool.retired == 1
    fake.random()  # random ops work again
    graph = fake.cuda.CUDAGraph()
    cuda_capture.capture(graph, lambda: None, DEV, pool, Stream())  # and so does the next capture
    assert graph.ended and fake.current is fake.default


def test_a_capture_cuda_invalidates_leaves_nothing_behind_on_torch_2_11(fake: FakeTorch) -> None:
    pool = cuda_capture.GraphPool(DEV)
    first = pool.handle
    with pytest.raises(RuntimeError, match="previous error during capture"):
        cuda_capture.capture(fake.cuda.CUDAGraph(), fake.synchronize, DEV, pool, Stream())
    assert list(fake.host_recording) == [first]  # out of Python's reach: the id is retired
    assert len(cuda_capture.ABANDONED) == 1  # its graph, which that recording's filter reads
    assert_clean(fake, pool, first)


def test_torch_that_ends_the_recordings_itself_gets_no_pool_back_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakeTorch(ends_recording_on_failure=True))
    pool = cuda_capture.GraphPool(DEV)
    first = pool.handle
    with pytest.raises(RuntimeError, match="previous error during capture"):
        cuda_capture.capture(fake.cuda.CUDAGraph(), fake.synchronize, DEV, pool, Stream())
    assert not fake.host_recording
    assert_clean(fake, pool, first)


def test_a_stream_left_capturing_is_ended(fake: FakeTorch) -> None:
    """The capture itself is fine, but `fn` leaves another stream current: torch's capture_end
    refuses before it ends the stream's capture; unwinding ends it."""
    pool = cuda_capture.GraphPool(DEV)
    first = pool.handle
    with pytest.raises(RuntimeError, match="same stream"):
        cuda_capture.capture(fake.cuda.CUDAGraph(), lambda: fake.cuda.set_stream(object()), DEV, pool, Stream())
    assert_clean(fake, pool, first)


def test_unwinding_that_fails_still_raises_the_capture_error(fake: FakeTorch, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(fake, "zeros", broken)
    with pytest.raises(RuntimeError, match="previous error during capture"):
        cuda_capture.capture(fake.cuda.CUDAGraph(), fake.synchronize, DEV, cuda_capture.GraphPool(DEV), Stream())
    assert "could not settle the default CUDA generator" in caplog.text
    assert fake.current is fake.default and not fake.device_recording


def test_a_capture_waits_for_its_caller_only(fake: FakeTorch, monkeypatch: pytest.MonkeyPatch) -> None:
    """No device-wide synchronize and no emptied allocator caches (what `torch.cuda.graph` does
    first): serving beside a capture goes on with its memory; the capture stream waits for the
    caller's stream."""
    calls: list[str] = []
    monkeypatch.setattr(fake, "synchronize", lambda *a: calls.append("synchronize"))
    monkeypatch.setattr(fake.cuda, "empty_cache", lambda: calls.append("empty_cache"), raising=False)
    monkeypatch.setattr(fake._C, "_host_emptyCache", lambda: calls.append("host empty"), raising=False)

    class Side(Stream):
        def wait_stream(self, other: Any) -> None:
            calls.append("waited for the caller" if other is fake.current else "waited for another stream")

    graph = fake.cuda.CUDAGraph()
    cuda_capture.capture(graph, lambda: None, DEV, cuda_capture.GraphPool(DEV), Side())
    assert graph.ended and calls == ["waited for the caller"]


def test_private_streams_are_never_another_live_threads(fake: FakeTorch) -> None:
    """The H200 failure: a capture on a new pool stream that was the very stream another thread
    copied its steps' samples on. A thread's private streams are distinct from every other live
    thread's, whatever the pool's round-robin gives; a thread that ends gives its streams back."""
    engine = [cuda_capture.private_stream(DEV, p) for p in ("serve", "copy")]
    assert cuda_capture.private_stream(DEV, "copy") is engine[1]  # made once per thread
    other: list[Any] = []

    def prepare() -> None:  # a migration's thread: its own stream and one per capture purpose
        other.extend(cuda_capture.private_stream(DEV, p) for p in ("work", "capture"))
        with pytest.raises(RuntimeError, match="every CUDA stream"):  # the pool (4) is all held
            cuda_capture.private_stream(DEV, "settle")

    t = threading.Thread(target=prepare)
    t.start()
    t.join()
    handles = [s.cuda_stream for s in engine + other]
    assert len(set(handles)) == 4, handles
    del other[:], t
    gc.collect()
    t = threading.Thread(target=lambda: other.append(cuda_capture.private_stream(DEV, "capture")))
    t.start()
    t.join()  # the ended thread's two streams were free again
    assert other[0].cuda_stream not in {s.cuda_stream for s in engine}
