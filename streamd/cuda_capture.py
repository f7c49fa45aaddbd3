"""CUDA graph capture that other threads' CUDA work cannot break, and that cannot poison the next.

Two threads of the daemon use CUDA: the engine thread (steps, and the captures of graphs for new
batch sizes) and a migration's preparation (the target's copy, probe and graphs, on a worker
thread). A capture runs in "thread_local" mode, so the other thread may launch and copy meanwhile;
but a device-wide synchronize or `empty_cache` (which `torch.cuda.graph` does before it captures:
`capture` does not use it) while another thread captures invalidates that capture ("operation not permitted when
stream is capturing"). `DEVICE_LOCK` is held around every capture and every such call of streamd.

A capture that fails leaves capture state behind in torch 2.11: `CUDAGraph.capture_end` raises as
soon as `cudaStreamEndCapture` reports the invalidated capture, skipping the rest of its work.
The device allocator keeps recording to the capture's pool (every later `empty_cache` and capture
into it fail), so does the pinned-host allocator ("beginAllocateToPool: already recording to
mempool_id" at every later capture into the pool), the default CUDA generator stays in capture
mode ("Offset increment outside graph capture encountered unexpectedly" at every later random
op), the pool keeps the reference the capture took, and the capture stream stays current.
`capture` undoes each of these on failure (`unwind`); torch 2.12 and later undo some themselves,
and every step tolerates that.

Every stream either thread uses is its own (`private_stream`). torch hands out the 32 streams of
its pool round-robin, so a `torch.cuda.Stream()` made for each capture sooner or later is the very
CUDA stream another thread queues its steps' copies on: that thread's work then joins the capture
or depends on it, and both fail (on an H200, while a migration captured its target's ~50 graphs:
"operation would make the legacy stream depend on a capturing blocking stream",
"dependency created on uncaptured work in another stream", "operation not permitted on an event
last recorded in a capturing stream"; thousands of streams dropped). A private stream is one no
other live thread holds; a thread gives its streams back when it ends. Neither thread queues on
the legacy default stream either: the engine thread serves on a private stream
(`leave_legacy_stream`) and a migration's preparation runs on one (`own_stream`).

A graph keeps the cuBLAS workspace of the thread and stream it was captured on: torch gives each
thread's cuBLAS handle one workspace per stream, and the captured GEMMs use it at every replay
(split-K GEMMs keep partial sums and semaphores there). Two graphs captured on one stream of one
thread must never run at once, nor one of them beside eager work queued on that stream. The
engine thread's graphs all run on its serving stream, one after another. A migration's thread
captures each move's graphs on a stream other than the one the serving graphs came from
(`capturing_on`): its warm-ups, self-checks and captures run beside the engine's replays of the
last move's graphs. When both used one stream, a 1500-stream daemon on an H100 hung in its second
move, the engine's step and the preparation's self-check never finishing. Destroying a graph
(`CUDAGraph.reset`) also frees the workspaces of its capture stream (torch since pytorch#175276,
reported as pytorch#193402), while other live graphs captured there may still use them: the graphs of one placement (a move's, and those the
engine thread captures after it) are captured on streams no other placement's graphs use, and
are released together when the next move's target serves.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

DEVICE_LOCK = threading.RLock()

log = logging.getLogger("streamd.engine")

# torch < 2.12: `CUDAGraph.reset` gives back the pool reference of successful captures only.
RESET_KEEPS_FAILED_POOLS = torch.torch_version.TorchVersion(torch.__version__) < "2.12"

# Graphs of failed captures, kept alive: torch 2.11's pinned-host allocator keeps a recording
# entry whose filter reads its graph, and no Python call can end that entry.
ABANDONED: list[Any] = []


_TAKEN_LOCK = threading.Lock()
_TAKEN: dict[int, set[int]] = {}  # device index -> CUDA stream handles some live thread holds


class _ThreadStreams:
    """One thread's private streams, {(device index, purpose): stream}; given back when the
    thread ends (its thread-local data, and so this object, go then)."""

    def __init__(self) -> None:
        self.streams: dict[tuple[int, str], Any] = {}

    def __del__(self) -> None:
        try:
            with _TAKEN_LOCK:
                for (index, _), stream in self.streams.items():
                    _TAKEN.get(index, set()).discard(stream.cuda_stream)
        except Exception:  # noqa: BLE001 - at interpreter exit the module's globals may be gone
            pass


_LOCAL = threading.local()


def private_stream(device: torch.device, purpose: str) -> Any:
    """The calling thread's stream for `purpose` ("serve", "copy", "capture", ...) on `device`,
    made on first use: a stream of torch's pool that no other live thread holds (see the module
    docstring). Raises RuntimeError when every stream of the pool is held."""
    mine: _ThreadStreams | None = getattr(_LOCAL, "streams", None)
    if mine is None:
        mine = _LOCAL.streams = _ThreadStreams()
    index = _index(device)
    stream = mine.streams.get((index, purpose))
    if stream is None:
        with _TAKEN_LOCK:
            taken = _TAKEN.setdefault(index, set())
            for _ in range(64):  # the pool's 32 streams, twice round
                candidate = torch.cuda.Stream(index)  # type: ignore[no-untyped-call]
                if candidate.cuda_stream not in taken:
                    taken.add(candidate.cuda_stream)
                    stream = mine.streams[(index, purpose)] = candidate
                    break
            else:
                raise RuntimeError(f"every CUDA stream of torch's pool on cuda:{index} is held by a live thread")
    return stream


def leave_legacy_stream(device: torch.device) -> None:
    """If the calling thread's current stream on `device` is the legacy default stream, make
    the thread's own stream current there instead (it stays current for the thread's life; the
    current device is unchanged). The new stream first waits for what the legacy one has queued
    (the model's and the slot state's first copies). No-op off CUDA or when another stream is
    current."""
    if device.type != "cuda":
        return
    legacy = torch.cuda.current_stream(device)
    if legacy.cuda_stream != 0:
        return
    own = private_stream(device, "serve")
    own.wait_stream(legacy)
    with torch.cuda.device(device):
        torch.cuda.set_stream(own)


CAPTURE = "capture"  # the purpose of a thread's capture stream, unless `capturing_on` names another


def capture_purpose() -> str:
    """The purpose of the calling thread's capture stream now (`capturing_on`)."""
    return getattr(_LOCAL, "capture_purpose", CAPTURE)


def capture_stream(device: torch.device) -> Any:
    """The calling thread's stream for graph captures (and their warm-ups) on `device`."""
    return private_stream(device, capture_purpose())


def capture_on(purpose: str) -> None:
    """From now on the calling thread's captures use its private stream for `purpose`, and so a
    cuBLAS workspace of their own (see the module docstring)."""
    _LOCAL.capture_purpose = purpose


@contextmanager
def capturing_on(purpose: str) -> Iterator[None]:
    """`capture_on(purpose)` for the block only."""
    before = capture_purpose()
    capture_on(purpose)
    try:
        yield
    finally:
        capture_on(before)


@contextmanager
def own_stream(device: torch.device) -> Iterator[None]:
    """Queue the block's CUDA work for `device` on the calling thread's own stream, then wait for
    that stream: what the block made is ready for any other stream afterwards. No-op off CUDA."""
    if device.type != "cuda":
        yield
        return
    stream = private_stream(device, "work")
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()


class GraphPool:
    """A graph memory pool of one device, under the id of its current handle. A capture into it
    that fails retires the id (`unwind`), as does the release of the last graphs captured into
    it (`SharedPoolBackend`): later captures into the pool use a fresh one."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.handle: Any = torch.cuda.graph_pool_handle()
        self.retired = 0

    def retire(self) -> None:
        self.handle = torch.cuda.graph_pool_handle()
        self.retired += 1


def capture(graph: Any, fn: Callable[[], None], device: torch.device, pool: GraphPool, stream: Any) -> None:
    """Capture `fn` into `graph` on `stream` (of `device`) with memory from `pool`, holding
    `DEVICE_LOCK`. Raises what the capture raised, after `unwind` left no capture state behind.

    `torch.cuda.graph` is not used: before it captures it synchronizes the whole device and empties
    the device's and the pinned-host allocators' caches, so every capture beside serving (a lazy
    one on the engine thread, or a migration's preparation) waited for the step in flight and
    made the steps after it allocate their memory afresh. `stream` only waits for the caller's
    stream, which is all the capture depends on."""
    with DEVICE_LOCK, torch.cuda.device(device):
        caller = torch.cuda.current_stream(device)
        stream.wait_stream(caller)
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin(pool=pool.handle, capture_error_mode="thread_local")
                try:
                    fn()
                finally:
                    graph.capture_end()
        except BaseException:
            torch.cuda.set_stream(caller)
            unwind(graph, device, pool, stream)
            raise
        finally:
            torch.cuda.set_stream(caller)


def unwind(graph: Any, device: torch.device, pool: GraphPool, stream: Any) -> None:
    """Undo what the failed capture of `graph` into `pool` on `stream` left behind. Never raises
    (a step that fails is logged): the capture's own error is the one to report."""
    recording = _end_capture(graph, device, stream)
    # Newer torch: reset() drops the generators' state of this capture and its capture id, and
    # may end the recording and give the pool back itself (so it goes before our own ending).
    _step("reset the graph", graph.reset)
    ABANDONED.append(graph)
    _step("end the pool's recording", lambda: _end_recording(device, pool.handle, recording))
    # torch 2.11: only a capture_end that succeeds takes the default generator out of capture
    # mode; a throwaway capture that succeeds does that.
    _step("settle the default CUDA generator", lambda: settle_generator(device))
    # torch 2.11 never ends the pinned-host allocator's recording to the pool's id, and that
    # allocator refuses every later capture into the id: later captures use a fresh one.
    pool.retire()


def _end_capture(graph: Any, device: torch.device, stream: Any) -> bool:
    """Take `stream` out of capture mode if it is still capturing (a failure before or inside
    `capture_end`): `capture_end` calls `cudaStreamEndCapture`, which ends even an invalidated
    capture, then raises. False if a capture_end finished here (torch ended the allocator's
    recording, and `reset` gives the pool back); else True: the allocator may still record."""
    try:
        with torch.cuda.device(device), torch.cuda.stream(stream):
            if not torch.cuda.is_current_stream_capturing():
                return True
            graph.capture_end()
    except Exception:  # noqa: BLE001 - the invalidated capture: the stream left capture mode
        return True
    return False


def _end_recording(device: torch.device, handle: Any, recording: bool) -> None:
    """Stop the device allocator recording to `handle` (torch < 2.12 skips that when
    cudaStreamEndCapture fails), and, where torch's `reset` will not, give back the reference to
    the pool that capture_begin took along with it (else the pool's memory stays reserved)."""
    if recording and end_recording(device, handle) and RESET_KEEPS_FAILED_POOLS:
        torch._C._cuda_releasePool(_index(device), handle)


def end_recording(device: torch.device, handle: Any) -> bool:
    """Stop the device allocator recording to the pool `handle` on `device`; False when it was
    not recording (torch already ended it)."""
    end = getattr(torch._C, "_cuda_endAllocateToPool", None) or getattr(torch._C, "_cuda_endAllocateCurrentStreamToPool")  # older torch
    try:
        end(_index(device), handle)
    except RuntimeError:  # "not currently recording to mempool_id"
        return False
    return True


def settle_generator(device: torch.device) -> None:
    """Capture one tiny kernel on a fresh side stream into a private pool: torch 2.11's
    capture_begin puts the device's default generator in capture mode and this capture_end,
    which succeeds, takes it out. If this capture fails too, it is unwound without settling."""
    with torch.cuda.device(device):
        scratch = torch.zeros(1, device=device)
        side = private_stream(device, "settle")
        side.wait_stream(torch.cuda.current_stream(device))
        graph = torch.cuda.CUDAGraph()
        handle = torch.cuda.graph_pool_handle()
        try:
            with torch.cuda.stream(side):
                graph.capture_begin(pool=handle, capture_error_mode="thread_local")
                try:
                    scratch.add_(1)
                finally:
                    graph.capture_end()
        except BaseException:
            recording = _end_capture(graph, device, side)
            _step("reset the throwaway graph", graph.reset)
            ABANDONED.append(graph)
            _step("end the throwaway pool's recording", lambda: _end_recording(device, handle, recording))
            raise
        graph.reset()  # gives its pool back


def _step(what: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - unwinding goes on; the capture's error is raised
        log.warning("after a failed CUDA graph capture, could not %s (%s: %s)", what, type(e).__name__, e)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def synchronize_and_free(device: torch.device) -> None:
    """Wait for `device` and give its cached free memory back to the driver (never during a capture)."""
    if device.type != "cuda":
        return
    with DEVICE_LOCK:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
