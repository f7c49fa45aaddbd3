"""The encoder step over the batched slot state: eager, or replayed from CUDA graphs per bucket.

`EncoderStep` runs one cache-aware encoder step for the streams whose slots are `rows`: it
gathers their cache rows, encodes, and writes their next state back in place. The slots' channel
caches are rings (`EncoderCache.head`): of the C cached frames a step writes back only the
chunk's T (over the oldest), not all C shifted by T (at 160 ms chunks, 2 frames of 70 a layer;
the copies of the slot state were the largest part of the GPU's step at thousands of streams).

- eager: `ConformerEncoder.streaming_forward` with `rows`, which reads the slots straight into
  its attention windows and writes the chunk's frames back (on the CPU, when graphs are off,
  while the model is training, or for a bucket whose capture failed);
- graphs: a step of b streams replays the graph captured for its bucket, the smallest bucket
  size >= b (`streamd.buckets.bucket_size`: 1, 2, 4, 8, then `per_octave` sizes per octave, so
  padding stays under 1/per_octave). A replay launches the whole encoder at once: at small and mid batches the
  eager step is bound by launching its hundreds of kernels, not by the GPU.

Static buffers. All buckets share one set of flat buffers (mel, lengths, start, gather index,
attention windows, time caches in and out, encoder output), sized for `max_batch` at the first
capture (without one: for the largest bucket so far, grown by doubling); a bucket of n rows uses
the first elements of each, viewed as a contiguous tensor of n rows. The channel cache has no
buffer of its own: a step gathers the rings into the front C frames of the windows, the layers
write the chunk's frames after them in place, and those go back into the rings (`write_chunk`;
a separate input and next cache beside windows in the pool took 2.7x the memory: ~16 GB for a
1024-row fp32 part of a FastConformer-L at 1120 ms chunks). Where the attention kernel runs (on
CUDA; `ConformerEncoder.reads_slots`) nothing is gathered: the windows hold only the chunk's
frames and the kernel reads each row's cached keys and values from the slot rings in place, so
the graphs are bound to the slot storage too (`EncoderGraphKey.rings`). All graphs
share one private memory pool. Both are safe because buckets never run at once and a replay's
outputs are copied out before the next replay. Of a bucket's n rows, the b real ones are copied
in; the padded rows gather a copy of the first real stream's cache and keep earlier mel, length
and start values (finite: zeros or an earlier real step's). Every operation of the encoder is
row-wise (per-row masks, per-row attention, channel-wise norms), so padded rows never reach real
ones, and only real rows are copied back.

Validity, as for the decoder (`streamd.decoding.graphs`): graphs are bound to memory addresses.
Before every call the step compares an `EncoderGraphKey` (device, parameter dtype, data_ptr of
every encoder parameter and buffer, the call's attention context, mel window shape, the slot
cache's layout and, where read in place, its storage) with the one the graphs were captured
for; on any difference it drops every graph, the static buffers and the pool, and captures
again lazily, bucket by bucket, as buckets are used. Nothing device-specific exists before
the first call, so a plain `model.to(...)` (another GPU, bf16, the CPU and back) needs no
notification. An in-place weight update keeps the storage, and the graphs read the new values.
A capture that fails (out of memory, a kernel that cannot be captured) logs a warning and
calls `on_fallback`; that bucket then runs eagerly until the key changes (`eager_reason`
says why), and the failure leaves no capture state behind, so later captures succeed
(`streamd.cuda_capture`). Serving never breaks on it. `prepare` captures given batch sizes
ahead of their calls (a migration's target, off the engine thread).
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
from streamd.buckets import DEFAULT_PER_OCTAVE, bucket_size, check_per_octave, padded_bucket
from streamd.graph_keys import Storages, placement_changes
from streamd.model.attention import SlotRows
from streamd.model.encoder import ConformerEncoder, EncoderCache, Workspace, read_rings, step_frames, write_chunk

log = logging.getLogger("streamd.engine")

GRAPHS, EAGER = "graphs", "eager"
REQUESTS = ("auto", GRAPHS, EAGER)
MIN_STATIC_ROWS = 64  # the static buffers' first size: small batches then never regrow them
HELD = "a move is being prepared: batch sizes without a graph run eagerly until its cut-over"
SPACED = "the last graph was captured under {:.1f} s ago: batch sizes without one run eagerly until then"
FallbackObserver = Callable[[str], None]  # (reason)


@dataclass(frozen=True)
class EncoderGraphKey:
    """What captured graphs and static buffers are valid for."""

    device: torch.device
    dtype: torch.dtype
    weights: tuple[int, ...]  # data_ptr() of every encoder parameter and buffer
    att_context: tuple[int, int]  # the calls' argument, baked into the captured masks and cache shape
    window: tuple[int, int]  # (n_mels, W) of the mel input
    kv: bool = True  # the slot cache's layout (`EncoderCache.kv`): keys and values, or NeMo's inputs
    rings: tuple[int, ...] = ()  # data_ptr() and shape of the slot rings the kernel reads in place (): gathered

    def changes_from(self, old: EncoderGraphKey | None) -> str:
        """Why graphs captured for `old` cannot serve `self` ('' when they can)."""
        if old is None:
            return "first call"
        why = placement_changes(old, self)
        if old.att_context != self.att_context:
            why.append(f"attention context {list(old.att_context)} -> {list(self.att_context)}")
        if old.window != self.window:
            why.append(f"mel window {old.window} -> {self.window}")
        if old.kv != self.kv:
            why.append("cache layout " + " -> ".join("keys/values" if kv else "inputs" for kv in (old.kv, self.kv)))
        if old.rings != self.rings:
            why.append("slot rings read in place" if self.rings and not old.rings else
                       "slot rings gathered" if old.rings and not self.rings else "slot storage replaced")
        return ", ".join(why)


class EncoderGraphBackend:
    """Turns the encoder step into CUDA graphs. The CPU tests swap in a fake with this interface
    whose "graphs" call the step function."""

    warmup_runs = 2

    def supports(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def new_pool(self, device: torch.device) -> Any:
        return cuda_capture.GraphPool(device)

    def capture(self, device: torch.device, fn: Callable[[], None], pool: Any) -> Any:
        """Warm `fn` up on a side stream of `device`, then capture it into a graph in `pool`
        (`cuda_capture.capture`: no other thread's synchronize meanwhile; a failure leaves no
        capture state behind). Whatever fails, the caller's current stream is current again."""
        with torch.cuda.device(device):
            caller = torch.cuda.current_stream(device)
            stream = cuda_capture.capture_stream(device)
            try:
                stream.wait_stream(caller)
                with torch.cuda.stream(stream):
                    for _ in range(self.warmup_runs):
                        fn()
                caller.wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                cuda_capture.capture(graph, fn, device, pool, stream)
            finally:
                torch.cuda.set_stream(caller)
        return graph

    def release(self, device: torch.device) -> None:
        """Give dropped graphs' pool and buffers back to the driver."""
        cuda_capture.synchronize_and_free(device)


@dataclass
class _Views:
    """One bucket's n-row views of the static buffers."""

    mel: Tensor  # (n, n_mels, W) fp32
    lengths: Tensor  # (n,) int64
    start: Tensor  # (n,) int64
    rows: Tensor  # (n,) int64: the gather index (slot of each row)
    # (L, n, C + T_out, d or 2d): the gathered rings in the first C frames; the layers write the
    # chunk's frames after them, which go back into the rings (`write_chunk`). Where the kernel
    # reads the rings in place (`EncoderGraphKey.rings`): (L, n, T_out, 2d), the chunk's only.
    windows: Tensor
    cache: EncoderCache  # the gathered input cache: windows[:, :, :C] (or empty), (L, n, d, K-1), (n,), heads (n,)
    out: EncoderCache  # the next time cache, lengths and heads (its channel: the same view, unwritten)
    enc: Tensor  # (n, T_out, d)
    enc_len: Tensor  # (n,) int64


class _Static:
    """Flat buffers for up to `capacity` rows; `views(n)` are contiguous views of their fronts
    (the gathered rings: the front of the windows)."""

    def __init__(self, encoder: ConformerEncoder, key: EncoderGraphKey, capacity: int) -> None:
        d, dev, dt = encoder.dims, key.device, key.dtype
        n_mels, w = key.window
        t_out = step_frames(w)
        self.capacity, self.kv = capacity, key.kv
        self.cached = 0 if key.rings else key.att_context[0]  # ring frames gathered into the windows
        self.shapes: dict[str, tuple[int, ...]] = {  # per row
            "mel": (n_mels, w),
            "windows": (d.n_layers, self.cached + t_out, d.d_model * (2 if key.kv else 1)),
            "time": (d.n_layers, d.d_model, d.conv_kernel - 1), "enc": (t_out, d.d_model), "row": ()}

        def flat(what: str, dtype: torch.dtype) -> Tensor:
            per_row = 1
            for s in self.shapes[what]:
                per_row *= s
            return torch.zeros(capacity * per_row, device=dev, dtype=dtype)

        self.mel = flat("mel", torch.float32)
        self.lengths, self.start, self.rows = (flat("row", torch.long) for _ in range(3))
        self.windows = flat("windows", dt)
        self.time_in, self.time_out = flat("time", dt), flat("time", dt)
        self.len_in, self.len_out = flat("row", torch.long), flat("row", torch.long)
        self.head_in, self.head_out = flat("row", torch.long), flat("row", torch.long)
        self.enc, self.enc_len = flat("enc", dt), flat("row", torch.long)

    def views(self, n: int) -> _Views:
        sh = self.shapes
        (layers, frames, width), (_, dm, k) = sh["windows"], sh["time"]
        t_out = sh["enc"][0]
        windows = _front(self.windows, (layers, n, frames, width))
        gathered = windows[:, :, :self.cached]  # empty where the kernel reads the rings in place
        return _Views(
            _front(self.mel, (n, *sh["mel"])), self.lengths[:n], self.start[:n], self.rows[:n], windows,
            EncoderCache(gathered, _front(self.time_in, (layers, n, dm, k)), self.len_in[:n], self.kv,
                         self.head_in[:n]),
            EncoderCache(gathered, _front(self.time_out, (layers, n, dm, k)), self.len_out[:n], self.kv,
                         self.head_out[:n]),
            _front(self.enc, (n, *sh["enc"])), self.enc_len[:n])


def _front(flat: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The first elements of `flat` viewed as a contiguous tensor of `shape`."""
    numel = 1
    for s in shape:
        numel *= s
    return flat[:numel].view(shape)


@dataclass
class _Bucket:
    graph: Any
    views: _Views


class EncoderStep:
    """One encoder step over slot state, eager or from CUDA graphs (see the module docstring).

    Args: encoder: the model's encoder (read at every call, never moved here). mode: 'auto' or
    'graphs' (graphs wherever the backend supports the device), or 'eager' (never capture).
    max_batch: the most rows a call will have (the engine's slot capacity), which caps the static
    buffers' growth; None = no cap. per_octave: bucket sizes per octave (a power of two).
    on_fallback: called with the reason when a capture fails. backend: how graphs are made
    (tests replace it).
    """

    def __init__(self, encoder: ConformerEncoder, mode: str = "auto", *, max_batch: int | None = None,
                 per_octave: int = DEFAULT_PER_OCTAVE, on_fallback: FallbackObserver | None = None,
                 backend: EncoderGraphBackend | None = None) -> None:
        if mode not in REQUESTS:
            raise ValueError(f"encoder graph mode must be one of {REQUESTS}, not {mode!r}")
        check_per_octave(per_octave)
        self.encoder, self.requested = encoder, mode
        self._storages = Storages(encoder)
        self.max_batch, self.per_octave = max_batch, per_octave
        self.on_fallback = on_fallback
        self.backend = backend if backend is not None else EncoderGraphBackend()
        self._key: EncoderGraphKey | None = None
        self._static: _Static | None = None
        self._pool: Any = None
        self._buckets: dict[int, _Bucket] = {}
        self._work = Workspace()  # the eager path's windows on a CPU
        self.used_at: dict[int, float] = {}  # bucket size -> time.monotonic() of its last call
        self._failed: dict[int, str] = {}  # bucket size -> why its capture failed under `_key`
        self._mode = EAGER
        self._larger = False  # the last call replayed a larger bucket's graph than its own
        self._why_eager = "no call yet"
        self.rebuilds = 0  # key changes that dropped captured graphs or set up the first ones
        self.captures = 0
        self.fallbacks = 0
        self.last_rebuild_reason = ""
        self.last_capture_ms = 0.0
        self.fallback_reason: str | None = None
        # A capture on the calling (engine) thread holds every stream's results for 0.1-0.4 s.
        # hold_captures: a batch size without a graph runs eagerly instead (while a move is
        # prepared: this step's graphs go at the cut-over; set and cleared by `engine.migration`).
        # capture_spacing_s: a call captures at most one graph in this long, the sizes in between
        # run eagerly (a move's target: the sizes it did not prepare come all at once after the
        # cut-over, and back-to-back captures let a backlog build, whose larger batches are new
        # sizes again); while it is set, a size with a captured bucket of at most NEAR_PADDING
        # times its rows (or PAD_ROWS) replays that one and captures none of its own (the move
        # prepared a `buckets.cover`). `prepare` is neither held nor spaced.
        self.hold_captures = False
        self.capture_spacing_s = 0.0
        self._captured_at = -float("inf")  # time.monotonic() of the last capture on a call

    # -- public ------------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        """How the last call ran: 'graphs' or 'eager'."""
        return self._mode

    @property
    def padded(self) -> bool:
        """Whether the last call replayed the graph of a larger bucket than its own, padded
        (`_padded`: a move's cover, a capture held, spaced or failed)."""
        return self._larger

    @property
    def eager_reason(self) -> str:
        """Why the last call ran eagerly ('' when it replayed a graph)."""
        return "" if self._mode == GRAPHS else self._why_eager

    @property
    def key(self) -> EncoderGraphKey | None:
        """The key the current graphs are valid for (None: nothing set up)."""
        return self._key

    @property
    def buckets(self) -> list[int]:
        """Bucket sizes with a captured graph."""
        return sorted(self._buckets)

    @property
    def static_rows(self) -> int:
        """Rows the static buffers hold (0: none allocated)."""
        return self._static.capacity if self._static is not None else 0

    def current_key(self, mel: Tensor, att_context: tuple[int, int], kv: bool = True,
                    rings: Tensor | None = None) -> EncoderGraphKey:
        """The key for the encoder as it is now, a mel input (b, n_mels, W), an attention context,
        a slot cache layout (`EncoderCache.kv`) and the slot rings (L, S, C, w) it steps."""
        return self._key_for((int(mel.shape[1]), int(mel.shape[2])), att_context, kv, rings)

    def _key_for(self, window: tuple[int, int], att_context: tuple[int, int], kv: bool,
                 rings: Tensor | None) -> EncoderGraphKey:
        w = self.encoder.pre_encode.out.weight
        with torch.no_grad():  # as the calls run
            in_place = rings is not None and kv and self.encoder.reads_slots(w.device, step_frames(window[1]))
        where = (rings.data_ptr(), *rings.shape) if in_place and rings is not None else ()
        return EncoderGraphKey(w.device, w.dtype, self._storages.pointers(), att_context, window, kv, where)

    def prepare(self, sizes: list[int], window: tuple[int, int], att_context: tuple[int, int],
                room: Callable[[], bool] | None = None, slots: EncoderCache | None = None) -> list[int]:
        """Capture now, largest first, the graphs that calls of `sizes` rows with (n_mels, W)
        windows over the slot state `slots` (its layout and, where the attention reads them in
        place, its rings; None: the key/value layout, gathered) would capture, while `room()`
        (if given) allows (a migration captures its target's this way, off the engine thread,
        before the cut-over, over the slot state staged for it). A size that failed is tried
        again on its first call (it failed beside the source's memory). Returns the bucket sizes
        with a graph."""
        device = self.encoder.pre_encode.out.weight.device
        if self.requested == EAGER or self.encoder.training or not self.backend.supports(device):
            return []
        key = self._key_for(window, att_context, True if slots is None else slots.kv,
                            None if slots is None else slots.channel)
        for size in sorted({bucket_size(b, self.per_octave) for b in sizes if b > 0}, reverse=True):
            if room is not None and not room():
                break
            self._bucket(key, size, rings=None if slots is None else slots.channel)
        self._failed.clear()
        return self.buckets

    def reset(self) -> None:
        """Drop graphs and buffers now; the next call captures again."""
        self._drop()
        self._key = None
        self._failed.clear()
        self._mode = EAGER
        self._why_eager = "reset"

    @torch.no_grad()
    def __call__(self, cache: EncoderCache, rows: Tensor, mel: Tensor, lengths: Tensor, start: Tensor,
                 full: bool = False, *, att_context: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """Encode one chunk of b streams and update their caches in place.

        Args:
            cache: the slot state on the model's device and dtype, (L, S, C, d or 2d), (L, S, d, K-1),
                (S,), in either layout (part of the graph key).
            rows: (b,) int64 slot of each stream, on the model's device.
            mel: (b, n_mels, W) fp32 windows, on any device; lengths, start: (b,) int64 on the
                model's device (as for `ConformerEncoder.streaming_forward`).
            full: every row is complete (start 0, length W): the eager path skips the masks.
            att_context: the [left, right] attention context (C = left); part of the graph key.
        Returns: enc (b, T_out, d) and enc_len (b,), fresh tensors on the model's device.
        """
        b = int(rows.shape[0])
        device = cache.channel.device
        if cache.head is None:
            raise ValueError("the slot state's channel caches must be rings (init_cache(ring=True))")
        if device.type != "cpu":
            self._work.release()  # a model moved off the CPU keeps no windows there
        bucket = None
        if self.requested == EAGER:
            self._why_eager = "CUDA graphs are off"
        elif self.encoder.training:
            self._why_eager = "the model is in training mode"
        elif not self.backend.supports(device):
            self._why_eager = f"no CUDA graphs on {device.type}"
        elif b > 0:
            now = time.monotonic()
            self.used_at[bucket_size(b, self.per_octave)] = now
            spaced, captures = now - self._captured_at < self.capture_spacing_s, self.captures
            bucket = self._bucket(self.current_key(mel, att_context, cache.kv, cache.channel), b,
                                  capture=not (self.hold_captures or spaced), rings=cache.channel)
            if bucket is None:
                why = HELD if self.hold_captures else SPACED.format(self.capture_spacing_s) if spaced else ""
                self._why_eager = self._failed.get(bucket_size(b, self.per_octave), why)
            elif self.captures > captures:  # a call's capture stalls the engine thread; `prepare`'s do not
                self._captured_at = now
        if bucket is None:
            self._mode, self._larger = EAGER, False
            return self._eager(cache, rows, mel, lengths, start, full, att_context)
        self._mode, self._larger = GRAPHS, int(bucket.views.rows.shape[0]) > bucket_size(b, self.per_octave)
        return self._replay(bucket, cache, rows, mel, lengths, start)

    # -- the two paths -----------------------------------------------------------------------
    def _eager(self, cache: EncoderCache, rows: Tensor, mel: Tensor, lengths: Tensor, start: Tensor,
               full: bool, att_context: tuple[int, int]) -> tuple[Tensor, Tensor]:
        # The slots are read into the attention windows and written back in place. On a CPU the
        # windows stay allocated between steps (its allocator maps big blocks afresh each time);
        # CUDA's caching allocator keeps its blocks anyway.
        on_cpu = cache.channel.device.type == "cpu"
        enc, enc_len, _ = self.encoder.streaming_forward(mel.to(cache.channel.device), lengths, cache, att_context,
                                                         start=start, full=full, rows=rows,
                                                         work=self._work if on_cpu else None)
        return enc, enc_len

    def _replay(self, bucket: _Bucket, cache: EncoderCache, rows: Tensor, mel: Tensor, lengths: Tensor,
                start: Tensor) -> tuple[Tensor, Tensor]:
        v, b = bucket.views, int(rows.shape[0])
        n = v.rows.shape[0]
        v.mel[:b].copy_(mel)
        v.lengths[:b].copy_(lengths)
        v.start[:b].copy_(start)
        v.rows[:b].copy_(rows)
        if n > b:
            v.rows[b:].copy_(rows[:1].expand(n - b))
        if v.cache.channel.shape[2]:  # else the kernel reads the rings in place
            read_rings(cache.channel, v.rows, v.cache.channel)
        torch.index_select(cache.time, 1, v.rows, out=v.cache.time)
        torch.index_select(cache.channel_len, 0, v.rows, out=v.cache.channel_len)
        assert cache.head is not None and v.cache.head is not None and v.out.head is not None
        torch.index_select(cache.head, 0, v.rows, out=v.cache.head)
        bucket.graph.replay()
        t = v.enc.shape[1]
        write_chunk(cache.channel, rows * cache.channel.shape[2], v.cache.head[:b], v.windows[:, :b, -t:])
        cache.time.index_copy_(1, rows, v.out.time[:, :b])
        cache.channel_len.index_copy_(0, rows, v.out.channel_len[:b])
        cache.head.index_copy_(0, rows, v.out.head[:b])
        return v.enc[:b].clone(), v.enc_len[:b].clone()

    # -- graphs ------------------------------------------------------------------------------
    def _bucket(self, key: EncoderGraphKey, b: int, capture: bool = True, rings: Tensor | None = None
                ) -> _Bucket | None:
        """The graph of b rows' bucket under `key` (captured now if need be and `capture`; else,
        or if its capture failed, a larger captured one, `_padded`; None: it runs eagerly).
        `rings`: the slot rings a graph reads in place where `key.rings` says so."""
        why = key.changes_from(self._key)
        if why:
            self._drop()
            self._key, self._failed = key, {}
            self.rebuilds += 1
            self.last_rebuild_reason = why
        size = bucket_size(b, self.per_octave)
        bucket = self._buckets.get(size)
        if bucket is None and self.capture_spacing_s:  # a move's target: a near bucket, padded, instead of a capture
            bucket = self._padded(size, near=True)  # near its bucket, as the move's `buckets.cover` was
        if bucket is None and (not capture or size in self._failed):
            return self._padded(b)
        return bucket if bucket is not None else self._capture(key, size, rings if key.rings else None)

    def _padded(self, b: int, near: bool = False) -> _Bucket | None:
        """A captured bucket for b rows, padded (`streamd.buckets.padded_bucket`; None: none)."""
        size = padded_bucket(b, self._buckets, near)
        return self._buckets[size] if size is not None else None

    def _capture(self, key: EncoderGraphKey, size: int, rings: Tensor | None) -> _Bucket | None:
        t0 = time.perf_counter()
        try:  # DEVICE_LOCK: no other thread's synchronize or capture meanwhile (`streamd.cuda_capture`)
            with cuda_capture.DEVICE_LOCK, _plain(key.device):
                if self._static is None or self._static.capacity < size:
                    self._grow(key, size)
                assert self._static is not None
                views = self._static.views(size)
                graph = self.backend.capture(key.device, partial(self._body, views, key.att_context, rings), self._pool)
        except Exception as e:  # noqa: BLE001 - no graph for this bucket: it runs eagerly
            self.fallbacks += 1
            self.fallback_reason = (f"CUDA graph capture failed for batch {size} "
                                    f"({type(e).__name__}: {e}); encoding that batch size eagerly")
            self._failed[size] = self.fallback_reason
            log.warning("encoder: %s", self.fallback_reason)
            if self.on_fallback is not None:
                self.on_fallback(self.fallback_reason)
            return None
        bucket = self._buckets[size] = _Bucket(graph, views)
        self.captures += 1
        self.last_capture_ms = (time.perf_counter() - t0) * 1e3
        log.info("encoder: captured batch %d on %s %s in %.0f ms (%s; %d buckets)", size, key.device,
                 str(key.dtype).removeprefix("torch."), self.last_capture_ms, self.last_rebuild_reason,
                 len(self._buckets))
        return bucket

    def _grow(self, key: EncoderGraphKey, size: int) -> None:
        """Static buffers for at least `size` rows: for max_batch's bucket at once if there is a
        max_batch (growing drops every graph, which a daemon whose batches grow with its load
        would pay for again and again), else the next power of two (at least MIN_STATIC_ROWS).
        Graphs read the old buffers, so all are dropped (and captured again on use)."""
        if self.max_batch is not None:
            rows = max(size, bucket_size(self.max_batch, self.per_octave))
        else:
            rows = max(MIN_STATIC_ROWS, 1 << (size - 1).bit_length())
        self._drop()
        self._static = _Static(self.encoder, key, rows)
        self._pool = self.backend.new_pool(key.device)

    def _body(self, v: _Views, att_context: tuple[int, int], rings: Tensor | None) -> None:
        """What a graph runs: the encoder on the static buffers (and the slot rings, read in place
        by the attention kernel, where `rings`), outputs into static buffers."""
        x, x_len, _ = self.encoder.streaming_forward(v.mel, v.lengths, v.cache, att_context, start=v.start, out=v.out,
                                                     windows=v.windows,
                                                     slots=None if rings is None else SlotRows(rings, v.rows))
        v.enc.copy_(x)
        v.enc_len.copy_(x_len)

    def _drop(self) -> None:
        """Release every graph, the pool and the static buffers."""
        had = bool(self._buckets) or self._static is not None
        self._buckets.clear()
        self._static = self._pool = None
        if had and self._key is not None and self.backend.supports(self._key.device):
            self.backend.release(self._key.device)


@contextmanager
def _plain(device: torch.device) -> Iterator[None]:
    """Static buffers and capture: ordinary tensors even under a caller's inference mode (they
    are updated in place later), no autograd, no autocast (the graph runs the weights' dtype)."""
    with torch.inference_mode(False), torch.no_grad(), torch.autocast(device.type, enabled=False):
        yield


def make_encoder_step(model: Any, mode: str = "auto", max_batch: int | None = None,
                      on_fallback: FallbackObserver | None = None) -> EncoderStep:
    """The encoder step for a `Transducer`: mode 'auto' | 'graphs' (capture on CUDA) | 'eager'."""
    return EncoderStep(model.encoder, mode, max_batch=max_batch, on_fallback=on_fallback)
