"""Live migration: move the serving model to another device and/or dtype while streams go on.

1. The target copy of the model is prepared on a worker thread while the engine keeps serving
   from the source (`placed_copy`).
   A probe chunk runs through the copy there, so a target that cannot run (no bf16 kernel,
   out of memory) fails before anything changes, and the device is warm.
   The slot-state buffers at the target are allocated then too (`stage_cache`), and the
   target's encoder step and decoder are made, with the CUDA graphs of the batch sizes the
   serving ones called in the last `IN_USE_S` seconds (those of the last `HOT_S` first, then
   those the target placement was called with when it last served, if it did; last, a
   `headroom` of larger sizes for a backlog's batches), the encoder's and the decoder's in turn
   (`prepare_steps`, on a side stream), so that the first steps after the move replay graphs
   instead of capturing them while every stream waits (capturing every size the warm-up made
   took 10-50 s a move at thousands of streams on an H200). Of those sizes only a cover: every
   called size gets a graph of at most `buckets.NEAR_PADDING` times its rows, which the target
   replays padded (every size called took 90 s a move at 3000 streams on an H100, most of the
   sizes from the streams' ramp-up). The captures are spaced out
   (`Pacer`): serving catches up between them, and none starts while the engine is behind.
   They run on one of two capture streams, not the one the serving graphs were captured on
   (`CAPTURE_STREAMS`): a graph's GEMMs keep using the cuBLAS workspace of its capture stream,
   and destroying a graph frees its stream's workspaces. After the cut-over the engine thread
   captures the sizes not prepared on a stream of the move's own (`Engine.cut_over`).
   Every CUDA call of this preparation that could break a capture on the engine thread (a
   synchronize, `empty_cache`, a capture) holds `cuda_capture.DEVICE_LOCK`, as the engine
   thread's captures do, and its work is queued on a stream of its own, never the legacy
   default stream (`cuda_capture.own_stream`).
   On a GPU the preparation leaves `MIN_FREE` of the target's memory to serving (`MemoryGuard`):
   a target whose weights and slot state would not fit beside what serves now is refused before
   anything is allocated, and graph captures stop when free memory falls to that share (the
   steps that serve meanwhile allocate too: a move that filled the GPU made them fail). The
   batch sizes left are captured on their first step after the move, when the source's graphs
   are gone. Memory the caching allocator holds for no tensor counts as free: the first time the
   GPU looks too full, the guard gives that cache back (one `empty_cache`, which waits for the step
   in flight) and asks again, once a migration.
   Meanwhile the source's encoder step and decoder capture no new graph on the engine thread
   (their graphs go at the cut-over, and such a capture would wait for the preparation's; a
   batch size without one replays a larger graph, padded, or runs eagerly until then).
2. At a step boundary (on the engine thread, in an `Engine.call`) `cut_over` swaps the model and
   its prepared steps in and copies every live stream's encoder caches and decoder state to the
   target. On any error everything is put back as it was (the source's graphs included).
3. A batch size without a prepared graph, or for the encoder one near enough (above), is
   captured lazily on its first step, as after a plain `model.to(...)`, but at most one every
   `LAZY_SPACING_S` for the encoder and one for the decoder (a size in between replays a
   captured graph of up to twice its rows, padded, where there is one, else the encoder's runs
   eagerly and the decoder's captures), so that a backlog of captures cannot build up.

`migrate` runs the three on the event loop for `Engine.migrate` and reports (`MigrationReport`).
"""
from __future__ import annotations

import asyncio
import copy
import functools
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

import torch

from streamd.buckets import cover
from streamd.cuda_capture import DEVICE_LOCK, capturing_on, own_stream
from streamd.engine import probes
from streamd.engine.encoder_step import EncoderStep
from streamd.engine.placement import DTYPE_NAMES, move_model
from streamd.engine.recognizer import Recognizer, Search
from streamd.errors import MigrationFailed
from streamd.model.encoder import EncoderCache
from streamd.model.transducer import Transducer

log = logging.getLogger("streamd.engine")

MIN_FREE = 0.1  # the share of a GPU's memory a migration leaves to serving while it prepares
IN_USE_S = 60.0  # a migration prepares the graphs of the batch sizes called this recently
HOT_S = 5.0  # ... those called this recently first (the first steps after the move need them)
# ... then those the target placement itself was called with this recently, when it served before
# (a move back from fp32 to bf16 steps smaller batches than fp32 did: on an H100 a third to 60 % of
# the encoder's calls ran eagerly for seconds after it, their sizes waiting for their lazy captures)
CALLED_BEFORE_S = 600.0
HEADROOM = 1.5  # ... and last, the source's graphs of sizes up to this many times the largest called (`headroom`)
GAP_WAIT_S = 3.0  # the most a migration waits for the first step after its cut-over (its serving gap)
# On the target, the engine thread captures the encoder graphs of sizes not prepared at most this
# far apart (0.1-0.4 s each at 1120 ms chunks and thousands of streams; back to back after a move
# on an H100, each capture's backlog made larger batches, new sizes again: h100-2026-12-05e), and
# the decoder's too (12 back to back in 6 s after a move at 3000 streams, 160 ms: h100-2026-12-06d)
LAZY_SPACING_S = 2.0
CAPTURE_SHARE = 0.5  # the most of a migration's graph-capturing time spent capturing (`Pacer`)
# No capture starts while the engine's last landed step was this far behind (`Engine.lag_s`; a
# step's oldest chunk waits about two step times when the engine keeps up: 0.02-0.1 s), waiting
# at most BEHIND_WAIT_S a capture and BEHIND_BUDGET_S a move, looking every BEHIND_POLL_S.
BEHIND_LIMIT_S = 0.25
BEHIND_WAIT_S = 2.0
BEHIND_BUDGET_S = 60.0
BEHIND_POLL_S = 0.02
CAPTURE_STREAMS = ("migration-a", "migration-b")  # moves capture on these in turn (`capture_stream_for`)


@dataclass
class MigrationReport:
    ok: bool
    source: str
    target: str
    prepare_ms: float  # before the pause, while serving went on: copy, probe, buffers, graphs
    pause_ms: float  # engine paused: swap, state conversion
    streams: int
    error: str = ""
    at: float = 0.0
    moved: bool = True  # False: the model already was at the target, nothing was done
    recapture_ms: float = 0.0  # part of prepare_ms: the target's CUDA graphs captured
    paced_ms: float = 0.0  # part of prepare_ms: waited between captures for serving (`Pacer`)
    behind_ms: float = 0.0  # part of paced_ms: waited because serving was behind (`Pacer.behind`)
    graphs: str = ""  # the batch sizes captured for the target ("encoder 12, decoder 9"), '' on a CPU
    graphs_deferred: int = 0  # batch sizes left to capture on their first step after the move (GPU memory)
    # last results delivered before the pause -> first after it (at most one chunk counted
    # before the pause; from the first post-move step's oldest chunk's arrival when it came
    # later: audio still on its way is no gap); None: no stream was open at the cut-over, or no
    # step landed in `GAP_WAIT_S`
    serving_gap_ms: float | None = None
    # streams a failed engine step ended while the move was prepared and cut over (0 when all
    # went well; the H200 runs of 2026-12-05 had thousands behind moves that reported ok)
    streams_failed: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def placement(model: Transducer) -> str:
    return f"{model.device} {DTYPE_NAMES[model.dtype]}"


def free_memory(device: torch.device) -> tuple[int, int] | None:
    """(free, total) bytes of a CUDA device (None elsewhere); off the engine thread, under
    DEVICE_LOCK like every other CUDA call of a migration's preparation."""
    if device.type != "cuda":
        return None
    with DEVICE_LOCK:
        return torch.cuda.mem_get_info(device)


def target_bytes(master: Transducer, dtype: torch.dtype, capacity: int, att_context: tuple[int, int],
                 kv: bool = True) -> int:
    """Bytes the target's weights and encoder slot state (layout `kv`) take at `dtype` (graphs come on top)."""
    size = torch.empty((), dtype=dtype).element_size()
    weights = sum(t.numel() * (size if t.is_floating_point() else t.element_size())
                  for t in (*master.parameters(), *master.buffers()))
    cache = master.encoder.init_cache(capacity, att_context, torch.device("meta"), dtype, kv, ring=True)
    state = sum(t.numel() * t.element_size() for t in (getattr(cache, f.name) for f in fields(cache))
                if isinstance(t, torch.Tensor))
    return weights + state


class MemoryGuard:
    """Keeps `min_free` of the target GPU's memory free for serving while a migration prepares
    (does nothing on a CPU). The first time too little looks free, the allocator's cached blocks
    are given back and the device asked again (`cuda_capture.capture` no longer empties the cache
    before each capture, so blocks no tensor uses pile up there and would stop the captures early)."""

    def __init__(self, device: torch.device, min_free: float = MIN_FREE) -> None:
        self.device, self.min_free = device, min_free
        self.emptied = False

    def _free(self, need: int) -> tuple[bool, tuple[int, int] | None]:
        """(whether `need` more bytes leave `min_free`, the device's (free, total) bytes)."""
        info = free_memory(self.device)
        if info is not None and info[0] - need < self.min_free * info[1] and not self.emptied:
            self.emptied = True
            _empty_cache(self.device)
            info = free_memory(self.device)
        return info is None or info[0] - need >= self.min_free * info[1], info

    def require(self, need: int, what: str) -> None:
        """Raise MigrationFailed, naming the numbers, if `need` more bytes would leave less free."""
        enough, info = self._free(need)
        if not enough and info is not None:
            free, total = info
            raise MigrationFailed(
                f"not enough memory on {self.device} for {what}: needs {need / 2**30:.1f} GiB, "
                f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free, {self.min_free:.0%} kept for serving")

    def room(self) -> bool:
        """Whether another graph may be captured now."""
        return self._free(0)[0]


class Pacer:
    """Spaces a migration's graph captures out so that serving near its capacity catches up
    between them: called before each capture, it first waits (1 - share) / share times as long
    as the time since its last call returned (the capture before), so captures take at most
    `share` (default `CAPTURE_SHARE`) of the wall time. A capture beside serving takes host (GIL)
    and GPU time from the steps: back to back, 45 s of them let 3000 streams at 160 ms on an
    H200 (about 85 % of the daemon's capacity there) fall 1.3 s behind. A move prepares about
    1 / share times as long.
    Then, with `behind` (the engine's `lag_s`), it waits while that is over `BEHIND_LIMIT_S`,
    at most `BEHIND_WAIT_S` a capture and `BEHIND_BUDGET_S` in all (a daemon that is always
    behind still moves): at that share, the moves of an H100 at 85 % of its capacity let the
    results fall 1-2 s behind, one move in four."""

    def __init__(self, share: float | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, behind: Callable[[], float] | None = None) -> None:
        self.share = CAPTURE_SHARE if share is None else share
        self.clock, self.sleep, self.behind = clock, sleep, behind
        self.returned: float | None = None  # when the last call returned (a capture began)
        self.waited = 0.0  # seconds waited in all
        self.waited_behind = 0.0  # ... of them while the engine was behind

    def __call__(self) -> None:
        if self.returned is not None and self.share < 1:
            wait = (self.clock() - self.returned) * (1 - self.share) / self.share
            self.sleep(wait)
            self.waited += wait
        if self.behind is not None:
            start = self.clock()
            until = start + min(BEHIND_WAIT_S, BEHIND_BUDGET_S - self.waited_behind)
            while self.behind() > BEHIND_LIMIT_S and self.clock() < until:
                self.sleep(BEHIND_POLL_S)
            self.waited_behind += self.clock() - start
            self.waited += self.clock() - start
        self.returned = self.clock()


def placed_copy(master: Transducer, device: torch.device, dtype: torch.dtype,
                probe: tuple[int, int] | None = None) -> Transducer:
    """A copy of the master weights (fp32, CPU, as loaded) at the target placement, made while
    the engine keeps serving; fp32 -> bf16 -> fp32 thus gives back the exact fp32 model.

    With `probe` (an attention context: the serving one), one silent chunk then runs through the
    copy (eager decoder, its own throwaway slot state): a target that cannot run (no kernel for
    the dtype, out of memory) fails here, and the device's context, libraries and kernels are
    warm before the engine pauses. Raises whatever the allocation or the probe raises."""
    target = copy.deepcopy(master)
    try:
        with DEVICE_LOCK:
            move_model(target, device, dtype)
        if probe is not None:
            with DEVICE_LOCK:
                probes.silent_chunk(Recognizer(target, capacity=1, att_context=probe))
                _synchronize(device)
    except BaseException:
        del target
        _empty_cache(device)
        raise
    return target


def stage_cache(target: Transducer, capacity: int, att_context: tuple[int, int], kv: bool = True) -> EncoderCache:
    """Slot-state buffers at the target placement, allocated (pages touched) before the pause,
    so the cut-over only copies into them. For a FastConformer-L with 256 slots the encoder
    cache is about 0.7 GB in fp32: allocating it inside the pause dominated a move to the CPU."""
    with DEVICE_LOCK:
        cache = target.encoder.init_cache(capacity, att_context, target.device, target.dtype, kv, ring=True)
        _synchronize(target.device)
    return cache


def capture_stream_for(rec: Recognizer) -> str:
    """The capture stream (purpose) for a move of `rec`: of `CAPTURE_STREAMS`, the one its
    serving graphs were not captured on. The preparation's warm-ups, self-checks and captures
    run beside the engine's replays of those graphs, and two graphs captured on one stream of
    the migration thread share that stream's cuBLAS workspace (`streamd.cuda_capture`)."""
    first, second = CAPTURE_STREAMS
    return second if rec.prepared_on == first else first


@dataclass
class PreparedSteps:
    """The target's encoder step and search, with graphs captured (on the migration thread's
    `captured_on` stream) for `graphs` batch sizes and `deferred` sizes left to their first step."""

    encoder_step: EncoderStep
    search: Search
    capture_ms: float
    graphs: str
    deferred: int = 0
    captured_on: str = ""


def prepare_steps(rec: Recognizer, target: Transducer, sizes: list[tuple[list[int], list[int]]],
                  room: Callable[[], bool] | None = None, slots: EncoderCache | None = None) -> PreparedSteps:
    """The target's encoder step and search (the recognizer's factories), with the graphs of the
    batch sizes `sizes` over the slot state `slots` (`stage_cache`'s, which the cut-over fills)
    captured now, off the engine thread, while `room()` (if given) allows:
    groups (`Recognizer.graph_sizes()`: the encoder's and the decoder's) in order, and in a
    group the encoder's and the decoder's sizes in turn, each largest first, of each group only
    a cover (`_in_turn`: a step needs both graphs; encoder sizes first in full left the decoder
    none when room ran out).
    A size not captured (no room, or out of memory) is left to the lazy capture on its first
    step, those captures spaced `LAZY_SPACING_S` apart on the target's encoder step and
    decoder (sizes in between replay a larger graph, padded, or run eagerly); on a CPU nothing
    is captured."""
    t0 = time.perf_counter()
    stopped = False

    def allowed() -> bool:
        nonlocal stopped
        stopped = stopped or (room is not None and not room())
        return not stopped

    encoder_step, search = rec.encoder_factory(target), rec.search_factory(target)
    encoder_step.capture_spacing_s = LAZY_SPACING_S
    if hasattr(search, "capture_spacing_s"):
        search.capture_spacing_s = LAZY_SPACING_S
    prepare = getattr(search, "prepare", None)
    enc: list[int] = []
    dec: list[int] = []
    captured_on = capture_stream_for(rec)
    order = _in_turn(sizes)
    with capturing_on(captured_on):
        for part, size in order:
            if stopped:
                break
            if part == "encoder":
                enc = encoder_step.prepare([size], rec.mel_window, rec.att_context, allowed, slots)
            elif prepare is not None:
                dec = prepare([size], allowed)
    graphs = f"encoder {len(enc)}, decoder {len(dec)}" if enc or dec else ""
    done = {("encoder", b) for b in enc} | {("decoder", b) for b in dec}
    deferred = len(set(order) - done) if stopped else 0
    if deferred:
        log.warning("migration: the graphs of %d batch sizes are left to their first step after the move "
                    "(%.0f%% of the GPU's memory kept free for serving)", deferred, MIN_FREE * 100)
    return PreparedSteps(encoder_step, search, (time.perf_counter() - t0) * 1000, graphs, deferred, captured_on)


def headroom(captured: tuple[list[int], list[int]], called: tuple[list[int], list[int]]
             ) -> tuple[list[int], list[int]]:
    """Of the serving graphs' sizes `captured` (encoder's, decoder's), those above the largest
    `called` and at most `HEADROOM` times it: a move prepares them last, for the larger batches
    of a backlog (a size with no graph after the move runs eagerly or stalls every stream for
    its capture, and the graph warm-up's sizes are no calls)."""
    def above(sizes: list[int], used: list[int]) -> list[int]:
        top = max(used, default=0)
        return [b for b in sizes if top < b <= HEADROOM * top]
    return above(captured[0], called[0]), above(captured[1], called[1])


def _in_turn(sizes: list[tuple[list[int], list[int]]]) -> list[tuple[str, int]]:
    """The order `prepare_steps` captures in: group by group, the encoder's and the decoder's
    batch sizes in turn, each largest first; of a group's sizes only a `cover` (those that,
    with the sizes taken before, leave every one of them a graph of at most `NEAR_PADDING`
    times its rows or `PAD_ROWS`: the target replays those padded)."""
    order: list[tuple[str, int]] = []
    taken: dict[str, list[int]] = {"encoder": [], "decoder": []}
    for enc_sizes, dec_sizes in sizes:
        enc, dec = cover(enc_sizes, taken["encoder"]), cover(dec_sizes, taken["decoder"])
        taken["encoder"] += enc
        taken["decoder"] += dec
        order += [(part, size) for pair in itertools.zip_longest(enc, dec)
                  for part, size in zip(("encoder", "decoder"), pair) if size is not None]
    return order


def cut_over(rec: Recognizer, target: Transducer, staged: EncoderCache | None = None,
             steps: PreparedSteps | None = None) -> tuple[float, int, Callable[[], None]]:
    """Swap a prepared `target` in at a step boundary (with its `steps`, if prepared); runs on
    the engine thread, so no step runs meanwhile and audio that arrives is queued. Converts
    every live stream's encoder caches (into `staged`, if given) and decoder carry. Returns
    (pause ms, live streams, release): `release()` (idempotent) frees the source model, its graphs
    and its pools, which takes tens of ms on a GPU, so the caller runs it after the first step on
    the target instead of inside the pause, unless that step needs the memory. On failure puts
    the source back and raises MigrationFailed."""
    t0 = time.perf_counter()
    source, source_steps = rec.model, (rec.encoder_step, rec.search)
    try:
        rec.use_model(target, staged, (steps.encoder_step, steps.search) if steps is not None else None)
        rec.state_tensors()
        t1 = time.perf_counter()
        _synchronize(target.device)
    except Exception as e:
        rec.use_model(source, None, source_steps)
        rec.state_tensors()
        _empty_cache(target.device)
        raise MigrationFailed(f"{type(e).__name__}: {e}") from e
    t2 = time.perf_counter()
    if steps is not None:
        rec.prepared_on = steps.captured_on
    log.info("migration cut-over: state queued %.1f ms, synchronized %.1f ms (%d streams)",
             (t1 - t0) * 1000, (t2 - t1) * 1000, rec.active)
    held: list[object] = [source, source_steps]  # until released
    device = source.device

    def release() -> None:
        if not held:
            return
        t = time.perf_counter()
        with DEVICE_LOCK:  # no capture runs while the source's graphs and pools go
            held.clear()
            _empty_cache(device)
        log.info("migration: source %s released in %.1f ms", device, (time.perf_counter() - t) * 1000)

    return (t2 - t0) * 1000, rec.active, release


# A migration's preparation runs on this one thread: its private CUDA streams
# (`cuda_capture.private_stream`) are made once, not once for each thread of a pool.
_PREPARING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamd-migration")


async def _prepare(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` on the migration thread, awaited."""
    return await asyncio.get_running_loop().run_in_executor(_PREPARING, functools.partial(fn, *args))


def _off_legacy(device: torch.device, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` with its CUDA work on a stream of this worker thread's own, finished when it
    returns (`cuda_capture.own_stream`): the engine thread may be capturing meanwhile."""
    with own_stream(device):
        return fn(*args)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        with DEVICE_LOCK:
            torch.cuda.synchronize(device)


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        with DEVICE_LOCK:
            torch.cuda.empty_cache()


class Host(Protocol):
    """What a migration needs of the engine it moves (`Engine`)."""

    recognizer: Recognizer
    streams_failed: int
    lag_s: float

    async def call(self, fn: Callable[[Recognizer], Any]) -> Any: ...

    def set_cutting_over(self, on: bool) -> None: ...

    def cut_over(self, rec: Recognizer, target: Transducer, staged: Any, steps: PreparedSteps
                 ) -> tuple[float, int, float, Future[tuple[float, float]] | None, Callable[[], None]]: ...


async def migrate(engine: Host, master: Transducer, device: torch.device | None, dtype: torch.dtype | None
                  ) -> MigrationReport:
    """Move `engine`'s serving to a copy of `master` (fp32 CPU weights) at `device` / `dtype`
    (None: as now) while streams go on: the copy is made and probed, and its CUDA graphs
    captured, off the engine thread, then swapped in between two steps with every live stream's
    state. On failure the engine keeps serving where it was; the report says why. When streams
    are open at the cut-over, returns once the first step after it has delivered its results (at
    most `GAP_WAIT_S` later): the report has the serving gap."""
    rec = engine.recognizer
    # the source's encoder step and decoder: no new graphs on the engine thread while the target
    # prepares (such a capture would wait for the preparation's, holding every stream's results)
    held = [part for part in (rec.encoder_step, rec.search) if hasattr(part, "hold_captures")]
    source = placement(rec.model)
    report = MigrationReport(False, source, source, 0.0, 0.0, rec.active, at=time.time())
    failed_before = engine.streams_failed
    try:
        dev = device if device is not None else rec.model.device
        dt = dtype if dtype is not None else rec.model.dtype
        report.target = f"{dev} {DTYPE_NAMES[dt]}"
        if report.target == source:
            report.ok, report.moved = True, False
            return report
        t0 = time.perf_counter()
        for part in held:
            setattr(part, "hold_captures", True)
        guard = MemoryGuard(dev)
        need = target_bytes(master, dt, rec.capacity, rec.att_context, rec.kv_cache)
        await _prepare(guard.require, need, "the model and its stream state")
        target = await _prepare(_off_legacy, dev, placed_copy, master, dev, dt, rec.att_context)
        staged = await _prepare(_off_legacy, dev, stage_cache, target, rec.capacity, rec.att_context,
                                         rec.kv_cache)
        now = time.monotonic()
        recent = rec.graph_sizes(now - IN_USE_S)
        in_use = [rec.graph_sizes(now - HOT_S), rec.sizes_called_at(dev, dt, now - CALLED_BEFORE_S), recent,
                  headroom(rec.graph_sizes(), recent)]
        pace = Pacer(behind=lambda: engine.lag_s)

        def room() -> bool:  # before each capture: serving catches up, and memory allows
            pace()
            return guard.room()

        steps = await _prepare(_off_legacy, dev, prepare_steps, rec, target, in_use, room, staged)
        report.prepare_ms = (time.perf_counter() - t0) * 1000
        report.paced_ms, report.behind_ms = pace.waited * 1000, pace.waited_behind * 1000
        report.recapture_ms, report.graphs = steps.capture_ms - report.paced_ms, steps.graphs
        report.graphs_deferred = steps.deferred
        engine.set_cutting_over(True)
        try:
            report.pause_ms, report.streams, before, landed, release = await engine.call(
                lambda r: engine.cut_over(r, target, staged, steps))
        finally:
            engine.set_cutting_over(False)
        report.ok = True
    except Exception as e:  # noqa: BLE001 - whatever failed, serving goes on where it was
        report.error = str(e) if isinstance(e, (ValueError, MigrationFailed)) else f"{type(e).__name__}: {e}"
        report.streams_failed = engine.streams_failed - failed_before
        return report
    finally:
        for part in held:
            setattr(part, "hold_captures", False)
    if landed is not None:
        try:
            after, ready = await asyncio.wait_for(asyncio.wrap_future(landed), GAP_WAIT_S)
        except TimeoutError:
            pass  # no step since: nothing to measure
        else:  # a stream whose chunk came after the cut-over waited from then only
            report.serving_gap_ms = (after - max(before, ready)) * 1000
    report.streams_failed = engine.streams_failed - failed_before
    await _prepare(release)
    return report
