"""Label-looping greedy RNN-T decoding replayed from CUDA graphs, rebuilt lazily on any change.

`GraphGreedyLabelLooping` runs the step methods of the reference `GreedyLabelLooping` (there is
no decoding math here) on static buffers sized for (max_batch, max_frames), in one of three modes:

- ``full_graph``: the whole decode is one CUDA graph with conditional WHILE nodes
  (`cuda_conditional.py`, needs cuda-python's `cuda.bindings`): one launch, no host sync;
- ``no_while_loops``: the four steps are separately captured graphs and Python drives the two
  loops, reading the 0-dim loop flags (one host sync per loop iteration);
- ``eager``: the reference decoder itself: on the CPU, when graphs are disabled, or when
  capture failed.

Graphs are bound to memory addresses, so they are valid only for the device, dtype and weight
storage they were captured with. Before every call the decoder compares a `GraphKey` (device type
and index, parameter dtype, data_ptr of every prediction-net and joint parameter, capacity) with
the captured one; on any difference it drops graphs and buffers (releasing their private memory
pool) and captures again on this call. Nothing device-specific exists before the first call, so
`model.to('cuda:1')`, `model.to(torch.bfloat16)`, `load_state_dict(..., assign=True)` or a trip
to the CPU and back need no notification. An in-place weight update (plain `load_state_dict`)
keeps the storage: the graphs stay valid and read the new values, and only the cached after-SOS
state, which depends on the values, is recomputed (parameters' version counters moved).
The carried decoder state passed in is moved/cast to the model's device and dtype on each call.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from streamd import cuda_capture
from streamd.buckets import bucket_size, check_per_octave, padded_bucket
from streamd.graph_keys import Storages, placement_changes
from streamd.decoding.greedy import DEFAULT_MAX_SYMBOLS, BatchedHyps, GreedyLabelLooping, LoopState
from streamd.decoding.state import DecoderState
from streamd.model.rnnt import Joint, Predictor

log = logging.getLogger("streamd.engine")

FULL_GRAPH, NO_WHILE_LOOPS, EAGER = "full_graph", "no_while_loops", "eager"
REQUESTS = ("auto", FULL_GRAPH, NO_WHILE_LOOPS, EAGER)
HELD = "a move is being prepared: batch sizes without a graph decode eagerly until its cut-over"
DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_FRAMES = 20  # a step decodes at most R+1 = 14 encoder frames (right context 13), plus margin
STEPS = ("before_outer", "before_inner", "inner", "after_inner")


@dataclass(frozen=True)
class GraphKey:
    """What captured graphs and buffers are valid for."""

    device: torch.device
    dtype: torch.dtype
    weights: tuple[int, ...]  # data_ptr() of every prediction-net and joint parameter
    batch: int
    frames: int

    def changes_from(self, old: GraphKey | None) -> str:
        """Why graphs captured for `old` cannot serve `self` ('' when they can)."""
        if old is None:
            return "first call"
        why = placement_changes(old, self)
        if (old.batch, old.frames) != (self.batch, self.frames):
            why.append(f"capacity {old.batch}x{old.frames} -> {self.batch}x{self.frames}")
        return ", ".join(why)


class CudaGraphBackend:
    """Turns step functions into CUDA graphs. The CPU tests swap in a fake with this interface."""

    warmup_runs = 3

    def supports(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def capture(self, device: torch.device, steps: dict[str, Callable[[], None]],
                warmup: Callable[[], None]) -> dict[str, Any]:
        """Warm up on a side stream of `device`, then capture each step into its own graph, all
        sharing one private memory pool (steps never overlap, and each step's temporaries die
        inside it). Graphs keep their cudaGraph_t so a full graph can embed them."""
        with torch.cuda.device(device):
            stream = cuda_capture.capture_stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(self.warmup_runs):
                    warmup()
            torch.cuda.current_stream(device).wait_stream(stream)
            pool = self.pool(device)
            graphs = {}
            for name, fn in steps.items():
                g = torch.cuda.CUDAGraph(keep_graph=True)
                cuda_capture.capture(g, fn, device, pool, stream)  # a failure leaves no capture state behind
                graphs[name] = g
        return graphs

    def pool(self, device: torch.device) -> cuda_capture.GraphPool:
        """The memory pool of the next capture: a new one each time."""
        return cuda_capture.GraphPool(device)

    def instantiate(self, graphs: dict[str, Any]) -> None:
        for g in graphs.values():
            g.instantiate()

    def full_graph(self, device: torch.device, graphs: dict[str, Any], active_any: Tensor,
                   advance_any: Tensor) -> Any:
        """The conditional-node graph (an object with replay() and close()), or raises why not."""
        from streamd.decoding.cuda_conditional import WhileLoopGraph, unsupported_reason
        reason = unsupported_reason(device)
        if reason:
            raise RuntimeError(reason)
        return WhileLoopGraph(device, graphs, active_any, advance_any)

    def release(self, device: torch.device) -> None:
        """Give the dropped graphs' pool and buffers back to the driver."""
        cuda_capture.synchronize_and_free(device)


class SharedPoolBackend(CudaGraphBackend):
    """Every capture on a device shares one memory pool: for the buckets of one decoder, which
    never run at once, and whose graphs keep nothing in the pool past their end (their loop
    state is allocated outside it). Private pools would each hold the temporaries of their
    batch size: at thousands of streams, tens of GB.

    Once every graph captured into the pool is released, the next capture takes a fresh pool
    id: torch's allocators keep a pool that no graph uses until their caches are emptied, and
    the pinned-host allocator's cache is not, so a capture into the old id failed its
    `use_count > 0` assertion (CachingHostAllocator.h; torch 2.11 on an H100: the decoder of a
    bucket whose graphs were dropped, for a move or a `reset`, decoded eagerly from then on)."""

    def __init__(self) -> None:
        self._pools: dict[torch.device, cuda_capture.GraphPool] = {}
        self._live: dict[torch.device, int] = {}  # captures whose graphs are alive, per device

    def capture(self, device: torch.device, steps: dict[str, Callable[[], None]],
                warmup: Callable[[], None]) -> dict[str, Any]:
        graphs = super().capture(device, steps, warmup)
        self._live[device] = self._live.get(device, 0) + 1
        return graphs

    def pool(self, device: torch.device) -> cuda_capture.GraphPool:
        if device not in self._pools:
            self._pools = {device: cuda_capture.GraphPool(device)}  # another device: the old pool goes
        return self._pools[device]

    def release(self, device: torch.device) -> None:
        """One capture's graphs were dropped (`_drop`); the last of a pool's retires its id."""
        self._live[device] = self._live.get(device, 0) - 1
        if self._live[device] <= 0:
            del self._live[device]
            if device in self._pools:
                self._pools[device].retire()
        super().release(device)


@dataclass
class _Captured:
    key: GraphKey
    loop: LoopState
    graphs: dict[str, Any]
    full: Any | None  # the conditional-node graph in full_graph mode
    sos: DecoderState  # after-SOS state, one row
    versions: tuple[int, ...]  # parameter version counters `sos` was computed at

    @property
    def mode(self) -> str:
        return FULL_GRAPH if self.full is not None else NO_WHILE_LOOPS


class GraphGreedyLabelLooping:
    """Drop-in for `GreedyLabelLooping` (same call and return) that replays CUDA graphs.

    Args: predictor, joint, blank_id, max_symbols: as for the reference. max_batch, max_frames:
    capacity of the static buffers (rows and encoder frames per call); a call beyond them grows
    the capacity and re-captures. mode: 'auto' (full graph where supported, else
    no_while_loops), 'full_graph' (same, logs a warning on fallback), 'no_while_loops', or
    'eager' (never capture). backend: how graphs are made (tests replace it).
    """

    verify_full_graph = True  # compare the full graph with the host-driven steps after capture

    def __init__(self, predictor: Predictor, joint: Joint, blank_id: int,
                 max_symbols: int = DEFAULT_MAX_SYMBOLS, *, max_batch: int = DEFAULT_MAX_BATCH,
                 max_frames: int = DEFAULT_MAX_FRAMES, mode: str = "auto",
                 backend: CudaGraphBackend | None = None) -> None:
        if mode not in REQUESTS:
            raise ValueError(f"mode must be one of {REQUESTS}, not {mode!r}")
        self.ref = GreedyLabelLooping(predictor, joint, blank_id, max_symbols)
        self.predictor, self.joint = predictor, joint
        self._storages = Storages(predictor, joint)  # where their weights are held, read cheaply per call
        self.requested = mode
        self.max_batch, self.max_frames = max_batch, max_frames
        self.backend = backend if backend is not None else CudaGraphBackend()
        self._cap: _Captured | None = None
        self._failed: GraphKey | None = None  # capture failed for this key: run eager until it changes
        self._mode = EAGER
        self.rebuilds = 0
        self.last_rebuild_reason = ""
        self.last_capture_ms = 0.0
        self.fallback_reason: str | None = None

    @classmethod
    def for_model(cls, model: Any, **kw: Any) -> GraphGreedyLabelLooping:
        """For a `Transducer`; keyword arguments as for the constructor."""
        return cls(model.decoder, model.joint, model.dims.blank_id, **kw)

    # -- public ------------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        """How the last call ran: 'full_graph', 'no_while_loops' or 'eager'."""
        return self._mode

    @property
    def key(self) -> GraphKey | None:
        """The key the current graphs were captured for (None: nothing captured)."""
        return self._cap.key if self._cap is not None else None

    @property
    def blank_id(self) -> int:
        return self.ref.blank_id

    @property
    def max_symbols(self) -> int:
        return self.ref.max_symbols

    def initial_state(self, batch: int) -> DecoderState:
        """The after-start state from the current weights, on their device and dtype."""
        with _exact(self.joint.pred.weight.device):
            return self.ref.initial_state(batch)

    @torch.no_grad()
    def reset_rows(self, state: DecoderState, rows: Tensor) -> None:
        """Put `rows` (indices, or a (B,) bool mask) of a batched carry back to the after-start
        state, in place."""
        if rows.dtype == torch.bool:
            rows = rows.nonzero().flatten()
        rows = rows.to(state.label.device)
        init = self.initial_state(int(rows.numel()))
        state.index_copy_(rows, _on(init, state.h.device, state.h.dtype))

    def reset(self) -> None:
        """Drop graphs and buffers now; the next call captures again."""
        self._drop()
        self._failed = None
        self._mode = EAGER

    def current_key(self) -> GraphKey:
        w = self.joint.pred.weight
        return GraphKey(w.device, w.dtype, tuple(p.data_ptr() for p in self._params()),
                        self.max_batch, self.max_frames)

    def __call__(self, enc: Tensor, lengths: Tensor, state: DecoderState | None = None
                 ) -> tuple[BatchedHyps, DecoderState]:
        """Args: enc (B, T, d); lengths (B,); state: carry from the previous chunk (None = start).
        Returns this chunk's labels (global times) and the new carry, as fresh tensors on the
        model's device."""
        with _exact(self.joint.pred.weight.device):
            return self._decode(enc, lengths, state)

    def decode_eagerly(self, enc: Tensor, lengths: Tensor, state: DecoderState | None = None
                       ) -> tuple[BatchedHyps, DecoderState]:
        """As a call, by the reference decoder whatever the mode (nothing captured)."""
        w = self.joint.pred.weight
        with _exact(w.device):
            self._mode = EAGER
            return self.ref(enc.to(w.device), lengths.to(w.device),
                            _on(state, w.device, w.dtype) if state is not None else None)

    def _decode(self, enc: Tensor, lengths: Tensor, state: DecoderState | None
                ) -> tuple[BatchedHyps, DecoderState]:
        w = self.joint.pred.weight
        device, dtype = w.device, w.dtype
        enc, lengths = enc.to(device), lengths.to(device)
        if state is not None:
            state = _on(state, device, dtype)
        b, t = int(enc.shape[0]), int(enc.shape[1])
        cap = None
        if self.requested != EAGER and b > 0 and self.backend.supports(device):
            cap = self._graphs_for(b, t)
        if cap is None:
            self._mode = EAGER
            return self.ref(enc, lengths, state)
        self._refresh_sos(cap)
        if state is None:
            state = cap.sos.expand(b)
        self.ref.load(cap.loop, enc, lengths, state)
        self._replay(cap)
        out = self.ref.results(cap.loop, b, t)
        self._mode = cap.mode
        return out

    # -- graphs ------------------------------------------------------------------------------
    def _params(self) -> list[Tensor]:
        return self._storages.tensors()

    def _versions(self) -> tuple[int, ...]:
        try:
            return tuple(p._version for p in self._params())
        except RuntimeError:  # inference tensors keep no version counter
            return ()

    def _graphs_for(self, b: int, t: int) -> _Captured | None:
        self.max_batch = max(self.max_batch, b)
        if t > self.max_frames:
            self.max_frames = -(-t // 8) * 8
        key = self.current_key()
        why = key.changes_from(self._cap.key if self._cap is not None else None)
        if why and key != self._failed:
            with cuda_capture.DEVICE_LOCK:  # no other thread's synchronize or capture meanwhile
                self._rebuild(key, why)
        return self._cap

    def prepare(self) -> bool:
        """Capture now what the next call would (a migration captures its target's graphs this
        way, off the engine thread, before the cut-over); True if graphs are ready."""
        device = self.joint.pred.weight.device
        if self.requested == EAGER or not self.backend.supports(device):
            return False
        with _exact(device):
            ready = self._graphs_for(self.max_batch, 0) is not None
        if not ready:
            self._failed = None  # it failed beside the source's memory: its first call tries again
        return ready

    @property
    def eager_reason(self) -> str:
        """Why the last call decoded eagerly ('' when it replayed graphs)."""
        if self._mode != EAGER:
            return ""
        if self.requested == EAGER:
            return "CUDA graphs are off"
        if not self.backend.supports(self.joint.pred.weight.device):
            return f"no CUDA graphs on {self.joint.pred.weight.device.type}"
        return self.fallback_reason or ""

    def _rebuild(self, key: GraphKey, why: str) -> None:
        self._drop()
        start = time.perf_counter()
        ref = self.ref
        loop = ref.new_loop(key.batch, key.frames, key.device)
        sos = ref.initial_state(1)
        # That ran the LSTM eagerly, which re-flattens (moves) its weights if they were assigned
        # since its last call; capture must see the settled pointers, and the key record them.
        key = self.current_key()
        steps: dict[str, Callable[[], None]] = dict(zip(STEPS, (partial(ref.before_outer_loop, loop), partial(ref.before_inner_loop, loop),
                                 partial(ref.inner_loop_step, loop), partial(ref.after_inner_loop, loop))))
        try:
            graphs = self.backend.capture(key.device, steps, partial(self._warmup, loop))
            self.backend.instantiate(graphs)
        except Exception as e:  # noqa: BLE001 - no capture here: decode eagerly until the key changes
            self._failed = key
            self.fallback_reason = f"CUDA graph capture failed ({type(e).__name__}: {e}); decoding eagerly"
            log.warning("label-looping decoder: %s", self.fallback_reason)
            return
        cap = _Captured(key, loop, graphs, None, sos, self._versions())
        if self.requested in ("auto", FULL_GRAPH):
            self._add_full_graph(cap)
        self._cap, self._failed = cap, None
        self.rebuilds += 1
        self.last_rebuild_reason = why
        self.last_capture_ms = (time.perf_counter() - start) * 1e3
        log.info("label-looping decoder: captured %s for %s %s, batch %d x %d frames in %.0f ms (%s)",
                 cap.mode, key.device, str(key.dtype).removeprefix("torch."), key.batch, key.frames,
                 self.last_capture_ms, why)

    def _add_full_graph(self, cap: _Captured) -> None:
        """Build the conditional-node graph; on any failure keep no_while_loops and say why."""
        try:
            cap.full = self.backend.full_graph(cap.key.device, cap.graphs, cap.loop.active_any,
                                               cap.loop.advance_any)
            if self.verify_full_graph and (bad := self._self_check(cap)):
                raise RuntimeError(f"full graph disagrees with the step graphs on {bad}")
            self.fallback_reason = None
        except Exception as e:  # noqa: BLE001 - any failure means: keep the step graphs
            if cap.full is not None:
                cap.full.close()
                cap.full = None
            self.fallback_reason = f"full_graph unavailable ({type(e).__name__}: {e}); using no_while_loops"
            (log.warning if self.requested == FULL_GRAPH else log.info)("label-looping decoder: %s",
                                                                         self.fallback_reason)

    def _warmup(self, loop: LoopState) -> None:
        """One pass through every step with every row active for a frame."""
        loop.lengths.fill_(1)
        self.ref.before_outer_loop(loop)
        self.ref.before_inner_loop(loop)
        self.ref.inner_loop_step(loop)
        self.ref.after_inner_loop(loop)
        loop.lengths.zero_()

    def _replay(self, cap: _Captured, host_loops: bool = False) -> None:
        if cap.full is not None and not host_loops:
            cap.full.replay()
            return
        g, loop = cap.graphs, cap.loop
        g["before_outer"].replay()
        while bool(loop.active_any):
            g["before_inner"].replay()
            while bool(loop.advance_any):
                g["inner"].replay()
            g["after_inner"].replay()

    def _self_check(self, cap: _Captured) -> str:
        """Decode the same synthetic batch with the host-driven step graphs and with the full
        graph; returns the names of buffers that differ ('' if none)."""
        loop, outs = cap.loop, []
        for host_loops in (True, False):
            gen = torch.Generator(device=loop.fproj.device).manual_seed(20240613)
            loop.fproj.normal_(generator=gen)
            frames = min(4, loop.fproj.shape[1])  # rows of 0..4 frames: every loop path, quickly
            torch.randint(0, frames + 1, loop.lengths.shape, generator=gen, device=loop.lengths.device,
                          out=loop.lengths)
            s = loop.state
            s.index_copy_(loop.batch_idx, cap.sos.expand(loop.lengths.shape[0]).clone())
            self._replay(cap, host_loops=host_loops)
            outs.append({"labels": loop.out_labels.clone(), "times": loop.out_times.clone(),
                         "lengths": loop.out_len.clone(), "h": s.h.clone(), "gproj": s.gproj.clone()})
        host, full = outs
        return ", ".join(k for k in host if not torch.equal(host[k], full[k]))

    def _refresh_sos(self, cap: _Captured) -> None:
        versions = self._versions()
        if versions != cap.versions:
            cap.sos, cap.versions = self.ref.initial_state(1), versions

    def _drop(self) -> None:
        cap, self._cap = self._cap, None
        if cap is None:
            return
        device = cap.key.device
        if cap.full is not None:
            cap.full.close()
        del cap  # graphs (and with them their pool), buffers
        self.backend.release(device)


@contextmanager
def _exact(device: torch.device) -> Iterator[None]:
    """Decode in the weights' own dtype: no autocast (mixed precision inside graph decoding gave
    NeMo garbage output), no autograd, and ordinary tensors even under a caller's inference mode
    (static buffers made there would refuse in-place updates outside it)."""
    with torch.inference_mode(False), torch.no_grad(), torch.autocast(device.type, enabled=False):
        yield


def _on(state: DecoderState, device: torch.device, dtype: torch.dtype) -> DecoderState:
    if state.h.device == device and state.h.dtype == dtype and state.label.device == device:
        return state
    return state.to(device, dtype)


class BucketedGraphDecoder:
    """A `GraphGreedyLabelLooping` per batch-size bucket (`streamd.buckets.bucket_size`): a call
    of b rows runs in the smallest bucket >= b, so a small batch does not pay for the largest
    one (one decoder's graphs always run at its capacity, the padded rows included). Each
    bucket's decoder is made on first use and captures and rebuilds by itself (same call and
    return as the reference decoder).

    Args: as for `GraphGreedyLabelLooping`, less max_batch; per_octave: buckets per octave (a
    power of two)."""

    def __init__(self, predictor: Predictor, joint: Joint, blank_id: int,
                 max_symbols: int = DEFAULT_MAX_SYMBOLS, *, max_frames: int = DEFAULT_MAX_FRAMES,
                 mode: str = "auto", per_octave: int = 4, backend: CudaGraphBackend | None = None) -> None:
        check_per_octave(per_octave)
        self.per_octave = per_octave
        self._make = partial(GraphGreedyLabelLooping, predictor, joint, blank_id, max_symbols,
                             max_frames=max_frames, mode=mode,
                             backend=backend if backend is not None else SharedPoolBackend())
        self._one = self._make(max_batch=1)  # start states, row resets, calls held from capturing (captures nothing)
        self._buckets: dict[int, GraphGreedyLabelLooping] = {}
        self._last: GraphGreedyLabelLooping | None = None
        self.padded = False  # the last call replayed a larger bucket's graphs than its own
        self.used_at: dict[int, float] = {}  # bucket size -> time.monotonic() of its last call
        # A call captures a new bucket at most once in this long; a size without graphs in between
        # replays a captured bucket of up to `MAX_PADDING` x its rows where there is one, else
        # captures (a move's target: the sizes it did not prepare came back to back after the
        # cut-over, each capture stalling every stream; set by `engine.migration`). `prepare` is not spaced.
        self.capture_spacing_s = 0.0
        self._captured_at = -float("inf")  # time.monotonic() of the last capture on a call
        # While a move is prepared (set and cleared by `engine.migration`) a call captures nothing:
        # a size without graphs replays a captured larger bucket, padded, or decodes eagerly. A
        # capture here would wait on `DEVICE_LOCK` for the move's own capture (up to 0.6 s beside
        # 3000 streams on an H100), every stream's results with it.
        self.hold_captures = False

    @property
    def requested(self) -> str:
        return self._one.requested

    @property
    def mode(self) -> str:
        """How the last call ran: 'full_graph', 'no_while_loops' or 'eager'."""
        return self._last.mode if self._last is not None else EAGER

    @property
    def buckets(self) -> dict[int, GraphGreedyLabelLooping]:
        """The decoder of each bucket used so far."""
        return dict(sorted(self._buckets.items()))

    @property
    def rebuilds(self) -> int:
        return sum(d.rebuilds for d in self._buckets.values())

    @property
    def last_capture_ms(self) -> float:
        return self._last.last_capture_ms if self._last is not None else 0.0

    @property
    def fallback_reason(self) -> str | None:
        return self._last.fallback_reason if self._last is not None else None

    @property
    def eager_reason(self) -> str:
        """Why the last call decoded eagerly ('' when it replayed graphs)."""
        if self._last is self._one:  # it decodes only the calls held from capturing
            return HELD
        return self._last.eager_reason if self._last is not None else "no call yet"

    def captured(self) -> list[int]:
        """The bucket sizes whose graphs are captured."""
        return [size for size, d in sorted(self._buckets.items()) if d.key is not None]

    def prepare(self, sizes: list[int], room: Callable[[], bool] | None = None) -> list[int]:
        """Capture now, largest first, the graphs of the buckets calls of `sizes` rows would use
        (see `GraphGreedyLabelLooping.prepare`), while `room()` (if given) allows; returns the
        bucket sizes with graphs."""
        for size in sorted({bucket_size(max(1, b), self.per_octave) for b in sizes}, reverse=True):
            if room is not None and not room():
                break
            d = self._buckets.get(size)
            if d is None:
                d = self._buckets[size] = self._make(max_batch=size)
            d.prepare()
        return self.captured()

    def initial_state(self, batch: int) -> DecoderState:
        return self._one.initial_state(batch)

    def reset_rows(self, state: DecoderState, rows: Tensor) -> None:
        self._one.reset_rows(state, rows)

    def reset(self) -> None:
        """Drop every bucket's graphs; each captures again on its next call."""
        for d in self._buckets.values():
            d.reset()

    def __call__(self, enc: Tensor, lengths: Tensor, state: DecoderState | None = None
                 ) -> tuple[BatchedHyps, DecoderState]:
        """As `GraphGreedyLabelLooping.__call__`."""
        b = max(1, int(enc.shape[0]))
        size, now = bucket_size(b, self.per_octave), time.monotonic()
        self.used_at[size] = now
        d = self._buckets.get(size)
        fresh = d is None or d.key is None
        self.padded = False
        if fresh and (self.hold_captures or now - self._captured_at < self.capture_spacing_s):
            padded = padded_bucket(b, self.captured())
            if padded is not None:
                d, fresh, self.padded = self._buckets[padded], False, True
            elif self.hold_captures:
                self._last = self._one
                return self._one.decode_eagerly(enc, lengths, state)
        if d is None:
            d = self._buckets[size] = self._make(max_batch=size)
        self._last = d
        out = d(enc, lengths, state)
        if fresh and d.key is not None:
            self._captured_at = now
        return out


_MAKE_MODES = {"auto": "auto", "graphs": NO_WHILE_LOOPS, NO_WHILE_LOOPS: NO_WHILE_LOOPS,
               FULL_GRAPH: FULL_GRAPH, EAGER: EAGER}


def make_decoder(model: Any, mode: str = "auto", max_batch: int = DEFAULT_MAX_BATCH,
                 max_frames: int = DEFAULT_MAX_FRAMES, max_symbols: int = DEFAULT_MAX_SYMBOLS,
                 per_octave: int | None = None
                 ) -> GreedyLabelLooping | GraphGreedyLabelLooping | BucketedGraphDecoder:
    """The decoder for a `Transducer`: mode 'auto' | 'graphs' (= no_while_loops) | 'full_graph' |
    'eager'. 'eager', or 'auto' on a machine without CUDA, gives the reference decoder; otherwise
    a graph decoder, which itself decodes eagerly whenever it finds the model on the CPU and
    captures again when the model is back on a GPU: one of capacity max_batch (which should be
    at least the engine's stream capacity), or with `per_octave`, one per batch-size bucket."""
    if mode not in _MAKE_MODES:
        raise ValueError(f"decoder mode must be one of {sorted(_MAKE_MODES)}, not {mode!r}")
    blank = model.dims.blank_id
    if mode == EAGER or (mode == "auto" and model.device.type != "cuda" and not torch.cuda.is_available()):
        return GreedyLabelLooping(model.decoder, model.joint, blank, max_symbols)
    if per_octave is not None:
        return BucketedGraphDecoder(model.decoder, model.joint, blank, max_symbols, max_frames=max_frames,
                                    mode=_MAKE_MODES[mode], per_octave=per_octave)
    return GraphGreedyLabelLooping(model.decoder, model.joint, blank, max_symbols, max_batch=max_batch,
                                   max_frames=max_frames, mode=_MAKE_MODES[mode])
