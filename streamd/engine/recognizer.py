"""Batched streaming recognition over fixed-capacity slots (synchronous; one engine thread).

Every live stream owns a slot: a row of the batched encoder caches, decoder carry and last
encoded mel frames, kept on the model's device. A step computes the new mel frames of the
streams that have a chunk ready (one batched call), assembles their windows there, runs one
encoder step and one decoder call, and scatters the rows back; the host only counts. Device
and dtype are read from the model's parameters at every step, and the slot tensors follow them:
a plain `model.to(...)` between steps is enough.
"""
from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from streamd.buckets import bucket_size
from streamd.cuda_capture import leave_legacy_stream, private_stream, synchronize_and_free
from streamd.decoding.graphs import EAGER as DECODER_EAGER, BucketedGraphDecoder, GraphGreedyLabelLooping
from streamd.decoding.greedy import BatchedHyps, GreedyLabelLooping
from streamd.decoding.state import DecoderState
from streamd.engine.encoder_step import EAGER, GRAPHS, EncoderStep, make_encoder_step
from streamd.engine.stream import SlotAudio, Stream
from streamd.engine.types import ChunkGeometry, ChunkResult, StepResults
from streamd.errors import CapacityError
from streamd.model.dims import PRE_ENCODE_CACHE
from streamd.model.encoder import EncoderCache
from streamd.model.preprocessor import LogMel
from streamd.model.transducer import Transducer

log = logging.getLogger("streamd.engine")

Search = GreedyLabelLooping | GraphGreedyLabelLooping | BucketedGraphDecoder  # not `model.decoder`, the prediction net
SearchFactory = Callable[[Transducer], Search]
EncoderFactory = Callable[[Transducer], EncoderStep]


def eager_encoder(model: Transducer) -> EncoderStep:
    return make_encoder_step(model, EAGER)


PART_ROWS = 1024  # streams per launched part of a GPU step (see `Recognizer`)
# A part whose slot range's rings hold more than this many times the samples its rows' segments
# need copies its own rows' segments, gathered on the host, instead of the whole slot range
# (`Recognizer._ring_segments`). The gather is a memcpy on the engine thread (4-15 GB/s on 2 CPU
# cores: 300 segments of 73 KB, at 1120 ms, in 3.0-3.5 ms), the range's copy runs at PCIe speed on
# a stream of its own, beside the step before: only a much sparser range is worth the host's
# time. (Counted in samples, not rings, so that rings with more room do not make the copy dearer:
# 48 is what 16 rings a stream were before `RING_ROOM_S`, 40-54 segments.)
RING_SPAN = 48
# A GPU step reads its rows' segments straight from the pinned rings, over the bus (the rings
# seen as a device tensor: unified addressing maps pinned host memory), instead of copying a
# slot range or a host-gathered batch (`Recognizer._read_mapped`): only the samples it uses
# cross, and the host copies none. Off, or where the rings cannot be seen from the step's
# device, the copies above.
MAPPED_RINGS = True
# On a GPU the step's log-mel runs on rows padded to this many buckets an octave: cuFFT makes a
# plan for each batch size it meets (1.3 ms of the engine thread's time at a new size: H100,
# rows of 250-350 streams), and a daemon's steps are of every size.
FEATURE_ROWS_PER_OCTAVE = 8
# Every slot's ring holds at least this much audio beyond the step in flight: a stream this far
# behind (a migration's pause, a burst of load) still writes each piece straight into its ring.
# Past it, pieces wait in `SlotAudio.raw` and cost the engine thread per-stream Python to queue
# and again to fill in, just when it is behind (measured: a tenth of its time in a daemon that
# could not keep up at 160-ms chunks, H100); 1 s of 16-kHz rings is 64 kB a slot.
RING_ROOM_S = 1.0


class Recognizer:
    """Owns the slot state and the attention context; the model, the search (greedy decoding, as
    `search`: `model.decoder` is the prediction net) and the encoder step (factories of the model)
    are passed in and never moved here.

    `att_context`: the [left, right] attention context every step uses, one the model was trained
    for (None: its default, the first); fixed for the recognizer's life (the slot caches hold
    `left` frames), passed to the encoder at every call. `features`: where a step's log-mel
    frames are computed, "model" (the model's device: one STFT for the batch where it is
    fastest) or "cpu".

    `part_rows`: a step of more streams is launched in parts of at most this many (even sizes):
    on a GPU the host prepares part k+1 (features, window layout) while the GPU runs part k, and
    no graph larger than a part is ever captured. None: never split.

    `keep_transcripts`: each `Stream` also accumulates its tokens and times (`tokens`, `times`:
    whole-file decoding, tests); a daemon, whose streams may run for days and get every step's
    labels in its `ChunkResult`, turns it off.

    `kv_cache`: the slot caches keep each layer's keys and values of the cached frames, so a step
    projects only its new frames (the default); False keeps NeMo's normalised attention inputs
    instead (the reference layout, same results; see `EncoderCache`).

    `ring_copy`: how a step's samples reach the model's device. True: the device reads each
    row's segment straight from the streams' pinned sample rings (`MAPPED_RINGS`: one gather a
    part, on a CUDA stream of its own that overlaps the step before), or where it cannot see
    them, copies the slot range of the step's rows (one copy a part; a step's streams go into
    parts in slot order, so that each part's range is short; a part whose range is sparse
    copies its own rows' segments, gathered on the host) and cuts each stream's segment out
    there; either way the host copies no samples; the rings are pinned when the model starts
    on a GPU. False: each stream copies its segment into one batch on the host (`SlotAudio.take`),
    which is then copied (the reference path, and the CPU's: there the batch is where the
    features are computed). None: True on a GPU whose rings
    are pinned and whose features are computed there, else False."""

    def __init__(self, model: Transducer, capacity: int, att_context: tuple[int, int] | None = None,
                 search_factory: SearchFactory = GreedyLabelLooping.for_model,
                 encoder_factory: EncoderFactory = eager_encoder, features: str = "model",
                 part_rows: int | None = PART_ROWS, keep_transcripts: bool = True, kv_cache: bool = True,
                 ring_copy: bool | None = None) -> None:
        if features not in ("model", "cpu"):
            raise ValueError(f"features must be 'model' or 'cpu', not {features!r}")
        if part_rows is not None and part_rows < 1:
            raise ValueError(f"part_rows must be at least 1, not {part_rows}")
        self.part_rows, self.keep_transcripts, self.kv_cache = part_rows, keep_transcripts, kv_cache
        self.ring_copy = ring_copy
        self.capacity, self.search_factory, self.encoder_factory = capacity, search_factory, encoder_factory
        self.model, self.search, self.encoder_step = model, search_factory(model), encoder_factory(model)
        # The capture stream (`cuda_capture.capturing_on`) of the migration whose graphs serve now
        # ('' before any): the next move captures on the other one.
        self.prepared_on = ""
        # The batch sizes (buckets) called at each placement a move left ({(device, dtype): ({encoder
        # bucket: time.monotonic() of its last call}, {decoder's})}): a move back to one prepares
        # them (`sizes_called_at`); a faster placement steps smaller batches than the one it leaves.
        self._called_before: dict[tuple[torch.device, torch.dtype], tuple[dict[int, float], dict[int, float]]] = {}
        self.att_context = model.dims.att_context(att_context)
        self.geometry = ChunkGeometry.of(model.dims, self.att_context[1])
        self.features = features
        # Live features are fp32, whatever the model's dtype; the streams' bookkeeping uses this CPU copy.
        self._logmel = copy.deepcopy(model.preprocessor).float().cpu()
        self._device_logmel: LogMel | None = None  # a copy on the model's device, made when needed
        # Every slot's raw samples, one ring each (`SlotAudio`): room for the samples of the step
        # in flight (held until the device has copied them), a whole next step's and half as many
        # more, and at least `RING_ROOM_S` of audio beyond the step in flight, so that a stream
        # that keeps up, or is briefly behind, writes every piece straight into its ring (pieces
        # that do not fit wait in `SlotAudio.raw` until a step, at twice the host work); pinned
        # when the model starts on a GPU, so that its steps can copy straight from it (`ring_copy`).
        full = self.geometry.segment_samples(self.geometry.new_frames(False))
        ring = max(2 * full + max(full // 2, 4096), full + int(RING_ROOM_S * self.geometry.sample_rate))
        self._rings = torch.zeros((capacity, ring), dtype=torch.float32, pin_memory=model.device.type == "cuda")
        self.audio = SlotAudio(self._rings.numpy(), self.geometry)
        self._rings_pinned = self._rings.is_pinned()  # asked once: each part would ask (a torch call)
        self._mapped: dict[torch.device, Tensor | None] = {}  # the rings seen from a device (`_mapped_rings`)
        self._held: list[np.ndarray] = []  # slots whose ring positions the last launch's copies hold
        self._ring_bytes = 0  # bytes of the rings the launch being queued copies (`Launched.ring_bytes`)
        self._copied: list[torch.cuda.Event] = []  # recorded after those copies (none off CUDA)
        # (thread, device) that `state_tensors` last moved off the legacy default stream
        self._off_legacy: tuple[int, torch.device] | None = None
        self._free = list(range(capacity - 1, -1, -1))
        self._fresh: dict[int, None] = {}  # slots opened since the last step: rows still to reset
        self._cache: EncoderCache | None = None
        self._dec: DecoderState | None = None
        self._tail: Tensor | None = None  # (capacity, n_mels, 9) fp32: each slot's last encoded mel frames
        self._staged: EncoderCache | None = None
        self._max_part: int | None = None  # set when the graph warm-up could not fit a whole part
        self._start: tuple[tuple[object, ...], DecoderState] | None = None  # see `_start_row`
        # Encoder (and decoder) calls since start, one per launched step part, and how many of
        # them the encoder and the decoder ran eagerly (no CUDA graph: off, not captured yet, failed).
        self.calls, self.eager_calls = 0, (0, 0)
        self.padded_calls = (0, 0)  # ... and how many replayed a larger bucket's graph than their own, padded

    def use_model(self, model: Transducer, staged: EncoderCache | None = None,
                  steps: tuple[EncoderStep, Search] | None = None) -> None:
        """Serve from another model object with the same weights and architecture (a migration
        target); slot state follows it at the next `state_tensors()`, copied into `staged`
        (buffers already allocated at the new placement, see `migration.stage_cache`) if given.
        `steps`: its encoder step and search, made (and their graphs captured) beforehand;
        None: made of the factories now."""
        encoder_step, search = steps if steps is not None else (self.encoder_factory(model), self.search_factory(model))
        enc, dec = self._called_before.setdefault((self.model.device, self.model.dtype), ({}, {}))
        enc.update(self.encoder_step.used_at)
        dec.update(getattr(self.search, "used_at", {}))
        self.model, self.search, self.encoder_step = model, search, encoder_step
        self._staged = staged

    @property
    def mel_window(self) -> tuple[int, int]:
        """(n_mels, W): the shape of one stream's encoder window."""
        return self._logmel.dims.n_mels, self.geometry.window

    def graph_sizes(self, since: float | None = None) -> tuple[list[int], list[int]]:
        """The batch sizes (buckets) with captured graphs: the encoder step's, the decoder's;
        with `since` (a time.monotonic() value) those called since then, captured or not (a size
        whose capture was held or spaced ran eagerly or padded)."""
        if since is None:
            captured = getattr(self.search, "captured", None)
            return self.encoder_step.buckets, captured() if captured is not None else []
        return _called_since((self.encoder_step.used_at, getattr(self.search, "used_at", {})), since)

    def sizes_called_at(self, device: torch.device, dtype: torch.dtype, since: float) -> tuple[list[int], list[int]]:
        """The encoder's and the decoder's batch sizes (buckets) called since `since` (a
        time.monotonic() value) when the model last served at `device` and `dtype` before a move
        ([] for a placement never left)."""
        return _called_since(self._called_before.get((device, dtype), ({}, {})), since)

    def eager_reason(self) -> str:
        """Why the last step encoded or decoded without CUDA graphs ('' when both replayed graphs)."""
        why = [f"{part}: {reason}" for part, reason in (
            ("encoder", self.encoder_step.eager_reason),
            ("decoder", getattr(self.search, "eager_reason", "the reference decoder (CUDA graphs off or no CUDA)")))
            if reason]
        return "; ".join(why)

    @property
    def active(self) -> int:
        return self.capacity - len(self._free)

    def open(self) -> Stream:
        if not self._free:
            raise CapacityError(f"all {self.capacity} stream slots are in use")
        slot = self._free.pop()
        self._fresh[slot] = None  # its rows are reset at the next step, with all others opened since
        return Stream.new(slot, self.audio)

    def capture_graphs(self, up_to: int, min_free: float = 0.1, stop: Callable[[], bool] = lambda: False) -> list[int]:
        """Step silent streams at every batch bucket (encoder's and decoder's) up to `up_to`
        streams, so that their CUDA graphs are captured before clients come (a capture
        mid-stream stalls every stream of that step). Largest first: the graphs share one memory
        pool, and a smaller graph's capture reuses the blocks a larger one freed (smallest first,
        every larger capture needs blocks bigger than any freed one: on an H200 at 1120 ms
        chunks, 100 GB of pools before batch 3328). A size that runs out of memory is skipped, and
        so is every size tried before the first capture while less than `min_free` of the GPU's
        memory is free (serving needs that memory more): smaller ones are still tried; if the
        largest did not fit, later steps launch in parts no larger than the largest that did.
        Uses free slots and gives them back. Captures every size asked for even where calls are
        spaced (`capture_spacing_s` of the encoder step and decoder, after a migration): a
        warm-up is the time to.
        Its steps are not calls of their sizes (`used_at`): a migration prepares the sizes that
        serving called (every warm-up size made an H100's first move at 3000 streams prepare 95
        graphs in 70-100 s). Ends before the next size once `stop()` says so. Returns the batch
        sizes stepped, largest first."""
        top = min(up_to, len(self._free), self._part_limit())
        sizes = sorted({min(bucket_size(b, per), top) for per in self._bucket_octaves() for b in range(1, top + 1)},
                       reverse=True)
        streams = [self.open() for _ in range(sizes[0] if sizes else 0)]
        hop = self._logmel.dims.hop_length
        piece = np.zeros(hop * self.geometry.new_frames(False) + self._logmel.dims.n_fft, dtype=np.float32)
        device = self.model.device
        done: list[int] = []
        parts = (self.encoder_step, self.search)
        spaced = [(part, part.capture_spacing_s) for part in parts if hasattr(part, "capture_spacing_s")]
        called = [(part, dict(part.used_at)) for part in parts if hasattr(part, "used_at")]
        for part, _ in spaced:
            part.capture_spacing_s = 0.0
        try:
            for n in sizes:
                if stop():  # the daemon is stopping before it served
                    break
                if device.type == "cuda" and not done:
                    free, total = torch.cuda.mem_get_info(device)
                    if free < min_free * total:
                        log.warning("graph warm-up skipped batch %d: %.1f of %.1f GiB free", n,
                                    free / 2**30, total / 2**30)
                        continue
                for s in streams[:n]:
                    s.push_audio(piece)
                try:
                    self.step(streams[:n])
                except torch.OutOfMemoryError:
                    log.warning("graph warm-up skipped batch %d: out of GPU memory", n)
                    synchronize_and_free(device)
                    continue
                done.append(n)
        finally:
            for part, spacing in spaced:
                part.capture_spacing_s = spacing
            for part, before in called:
                part.used_at = before
            for s in streams:
                self.close(s)
            synchronize_and_free(device)
        if done and done[0] < top:
            log.warning("steps launched in parts of at most %d streams: larger batches did not fit in GPU memory",
                        done[0])
            self._max_part = done[0]
        return done

    def _part_limit(self) -> int:
        """The most streams one launched part holds on the current device."""
        return min(self.part_rows or self.capacity, self._max_part or self.capacity)

    def _parts(self, n: int) -> list[tuple[int, int]]:
        """[start, end) of each part of a step of n streams: as few as `_part_limit` allows, even."""
        k = -(-n // self._part_limit()) if n else 1
        bounds = [n * i // k for i in range(k + 1)]
        return list(zip(bounds[:-1], bounds[1:]))

    def _bucket_octaves(self) -> set[int]:
        """Bucket sizes per octave of the encoder step and of the decoder (if they bucket)."""
        return {per for per in (getattr(self.encoder_step, "per_octave", None), getattr(self.search, "per_octave", None))
                if isinstance(per, int)} or {8}

    def close(self, stream: Stream) -> None:
        """Release the stream's slot (its rows are reset when the slot is reused)."""
        if stream.slot >= 0:
            self._free.append(stream.detach())

    def state_tensors(self) -> tuple[EncoderCache, DecoderState]:
        """The slot state on the model's current device and dtype (moved here if it is not).
        The calling (engine) thread's work on that device goes on a stream of its own from now on
        (`leave_legacy_stream`: the legacy default stream fails while another thread captures)."""
        device, dtype = self.model.device, self.model.dtype
        if self._off_legacy != (threading.get_ident(), device):  # a torch call: once per thread and device
            leave_legacy_stream(device)
            self._off_legacy = (threading.get_ident(), device)
        staged, self._staged = self._staged, None  # used now or never: it must not pin memory
        if staged is not None and (staged.channel.device != device or staged.channel.dtype != dtype
                                   or staged.kv != self.kv_cache
                                   or staged.channel.shape[1:3] != (self.capacity, self.att_context[0])):
            staged = None
        if self._cache is None or self._dec is None:
            self._cache = (staged if staged is not None else self.model.encoder.init_cache(
                self.capacity, self.att_context, device, dtype, self.kv_cache, ring=True))
            self._dec = self.search.initial_state(self.capacity)
        elif self._cache.channel.device != device or self._cache.channel.dtype != dtype:
            if staged is not None:
                staged.copy_(self._cache)
                self._cache = staged
            else:
                self._cache = self._cache.to(device, dtype)
            self._dec = self._dec.to(device, dtype)
        if self._tail is None or self._tail.device != device:
            self._tail = (torch.zeros(self.capacity, self._logmel.dims.n_mels, PRE_ENCODE_CACHE, device=device)
                          if self._tail is None else self._tail.to(device))
        return self._cache, self._dec

    def step(self, streams: list[Stream]) -> list[ChunkResult]:
        """Encode and decode one chunk of every given stream (each must be `ready`)."""
        return self.launch(streams).collect().chunks()

    @torch.no_grad()
    def launch(self, streams: list[Stream]) -> Launched:
        """Queue the step of `streams` (each must be `ready`) on the model's device and return
        without waiting for it; `collect()` on the result waits and gives the results. Until
        then the caller may push audio, open and close streams (a reused slot is reset by the
        next launch, queued behind this one) and launch further steps (their work queues behind
        this one's on the device; collect them in launch order)."""
        cache, dec = self.state_tensors()
        ring_wait_s = self._release_rings()
        device = cache.channel.device
        started = _event(device)  # before the step's first device work
        self._reset_fresh(cache, dec)
        self._ring_bytes = 0
        order = None
        from_rings = self._copies_rings(device)
        if from_rings:  # parts of neighbouring slots: each copies a short slot range
            order = np.argsort(np.fromiter((s.slot for s in streams), np.int64, len(streams)), kind="stable").tolist()
            streams = [streams[i] for i in order]
        parts = [self._launch_part(streams[a:b], cache, dec, from_rings) for a, b in self._parts(len(streams))]
        return Launched(self, parts, device, started, order, self._ring_bytes, ring_wait_s)

    def _launch_part(self, streams: list[Stream], cache: EncoderCache, dec: DecoderState, from_rings: bool) -> _Part:
        """Queue one part's features, windows, encoder step and decoder; the rows are independent
        of every other part's, so parts run back to back on the device while the host prepares
        the next. `from_rings`: the device copies the samples from the rings (`ring_copy`)."""
        device = cache.channel.device
        g, n = self.geometry, len(streams)
        # The streams' counting is a few numpy calls over the part (`SlotAudio`), and torch is
        # called a fixed number of times per part: no Python per stream on the device's path
        # (on the host batch's path, one numpy copy per stream). Each torch call releases and
        # re-takes the GIL, and with a busy event loop in the other thread every re-take can
        # wait a whole switch interval.
        audio = self.audio
        slots = np.fromiter((s.slot for s in streams), np.int64, n)
        news = audio.next_frames(slots)
        k = int(news.max()) if n else 1
        from_rings = from_rings and n > 0
        meta = _host(device, (n, 5 + g.window + PRE_ENCODE_CACHE), torch.int64)  # the last column: ring positions
        meta_np = meta.numpy()
        if from_rings:  # the device copies the samples from the rings: the streams only count
            taken = audio.take_held(slots, news)
            meta_np[:, -1] = taken[:, 3]
            self._held.append(slots)
        else:
            meta_np[:, -1] = 0
            samples = _host(device, (n, g.segment_samples(k)), torch.float32)
            taken = np.array([audio.take(slot, new, row) for slot, new, row in
                              zip(slots.tolist(), news.tolist(), samples.numpy())], dtype=np.int64).reshape(n, 3)
        _layout(taken[:, :3], news, slots, g.window, k, meta_np[:, :-1])
        meta_host, meta = meta, meta.to(device, non_blocking=True)
        if from_rings:
            samples = self._ring_segments(slots, meta[:, 2], meta[:, -1], meta_np[:, -1], g.segment_samples(k), device)
        frames = self._frames(samples, meta_host[:, 3], meta[:, 3], device)
        lengths, start, rows = meta[:, 0], meta[:, 1], meta[:, 2]
        mel = self._windows(frames, rows, meta[:, 4:-1])
        full = bool(n) and bool((meta_np[:, 1] == 0).all() and (meta_np[:, 0] == g.window).all())
        enc, enc_len = self.encoder_step(cache, rows, mel, lengths, start, full, att_context=self.att_context)
        hyps, new_dec = self.search(enc, enc_len, dec.index_select(rows))
        dec.index_copy_(rows, new_dec)
        self._count_call()
        return _Part(streams, slots, hyps, enc_len)

    def _count_call(self) -> None:
        """Count a part's encoder and decoder calls, and whether each ran eagerly (`eager_calls`)
        or replayed a larger bucket's graph, padded (`padded_calls`)."""
        eager = (self.encoder_step.mode != GRAPHS, getattr(self.search, "mode", DECODER_EAGER) == DECODER_EAGER)
        padded = (self.encoder_step.padded, getattr(self.search, "padded", False))
        self.calls += 1
        self.eager_calls = (self.eager_calls[0] + eager[0], self.eager_calls[1] + eager[1])
        self.padded_calls = (self.padded_calls[0] + (padded[0] and not eager[0]),
                             self.padded_calls[1] + (padded[1] and not eager[1]))

    def _copies_rings(self, device: torch.device) -> bool:
        """Whether a step on `device` copies its samples straight from the rings (`ring_copy`)."""
        if self.ring_copy is not None:
            return self.ring_copy
        return device.type == "cuda" and self._rings_pinned and self.features == "model"

    def _ring_segments(self, slots: np.ndarray, rows: Tensor, at: Tensor, at_host: np.ndarray, size: int,
                       device: torch.device) -> Tensor:
        """Every row's `size` samples from ring position `at` on, cut out on `device` from one
        copy; slots: (b,) the part's slots on the host; rows (the same slots), at: (b,) int64 on
        `device` (`at_host`: the same on the host). Returns (b, size) fp32. The copy is of the
        slot range when it is dense (its rings at most RING_SPAN times the rows' segments), cut on
        the device; else of the rows' own segments, gathered on the host into pinned memory first
        (`_gather_segments`): a daemon's small steps spread over thousands of slots, whose whole
        range is up to 0.9 GB of rings for a step of ~130 streams (1120 ms chunks, 4912
        streams), against 23 MB of their own rings and 9 MB of their segments. The rings'
        positions stay held until the copy has happened (`_release_rings`, at the next launch).
        Where the device can read the pinned rings themselves (`MAPPED_RINGS`), it gathers the
        rows' segments from them instead (`_read_mapped`): no copy of either kind."""
        if device.type == "cuda" and (mapped := self._mapped_rings(device)) is not None:
            return self._read_mapped(mapped, slots, at_host, size, device)
        lo, hi = int(slots.min()), int(slots.max()) + 1
        sparse = (hi - lo) * self._rings.shape[1] > RING_SPAN * slots.size * size
        if sparse:
            source = _host(device, (slots.size, size), torch.float32)
            order = _host(device, (slots.size,), torch.int64)
            _gather_segments(self._rings, slots, at_host, source, order.numpy())
        else:
            source = self._rings[lo:hi]
        self._ring_bytes += source.numel() * source.element_size()
        if device.type == "cuda":  # on a copy stream of its own: it overlaps the step before
            main, side = torch.cuda.current_stream(device), self._copy_stream(device)
            with torch.cuda.stream(side):
                rings = source.to(device, non_blocking=True)  # pinned: queued, no wait
                if sparse:
                    order = order.to(device, non_blocking=True)
                copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
                copied.record(side)
            main.wait_event(copied)
            rings.record_stream(main)  # its memory is not reused before the step has read it
            if sparse:
                order.record_stream(main)
            self._copied.append(copied)
        else:
            rings = source
        if sparse:
            return rings.index_select(0, order)
        m = rings.shape[1]
        index = (at[:, None] + torch.arange(size, device=device)) % m
        return rings[(rows - lo)[:, None], index]

    def _mapped_rings(self, device: torch.device) -> Tensor | None:
        """The pinned rings as a tensor on `device` that shares their memory (a kernel's reads
        cross the bus), or None: `MAPPED_RINGS` off, rings not pinned, or mapped for another
        device than `device` (pinned memory belongs to the device it was allocated for)."""
        if not (MAPPED_RINGS and self._rings_pinned):
            return None
        if device not in self._mapped:
            try:  # the same memory if it was pinned for `device`, else a copy there (dropped)
                seen: Tensor | None = torch.as_tensor(_DeviceView(self._rings), device=device)
            except RuntimeError as e:  # a driver or build without unified addressing
                log.info("the audio rings cannot be read from %s where they are (%s)", device, e)
                seen = None
            if seen is not None and seen.data_ptr() != self._rings.data_ptr():
                log.info("the audio rings cannot be read from %s where they are: pinned for another device", device)
                seen = None
            self._mapped[device] = seen
        return self._mapped[device]

    def _read_mapped(self, mapped: Tensor, slots: np.ndarray, at_host: np.ndarray, size: int,
                     device: torch.device) -> Tensor:
        """`_ring_segments` from the rings as `device` sees them (`_mapped_rings`): the slots'
        ring offsets and start positions are copied (one small pinned copy) and one gather on the
        copy stream reads each row's `size` samples over the bus; the step waits for it."""
        m = mapped.shape[1]
        where = _host(device, (2, slots.size), torch.int64)
        where_np = where.numpy()
        where_np[0] = slots * m
        where_np[1] = at_host % m
        main, side = torch.cuda.current_stream(device), self._copy_stream(device)
        with torch.cuda.stream(side):
            first, start = where.to(device, non_blocking=True)  # pinned: queued, no wait
            column = start[:, None] + torch.arange(size, device=device)  # (b, size), < 2m
            column = torch.where(column >= m, column - m, column)
            samples = torch.take(mapped, first[:, None] + column)
            read = torch.cuda.Event()  # type: ignore[no-untyped-call]
            read.record(side)
        main.wait_event(read)
        samples.record_stream(main)
        self._copied.append(read)
        self._ring_bytes += samples.numel() * samples.element_size()
        return samples

    def _copy_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The CUDA stream the copies from the rings run on: the launching thread's private one
        (`cuda_capture.private_stream`: never a stream another thread captures on)."""
        return private_stream(device, "copy")

    def _release_rings(self) -> float:
        """Once the last launch's copies from the rings have happened (a wait only if they are
        still queued, or running), its streams' ring positions are free again. Returns the
        seconds waited for them (`Launched.ring_wait_s`)."""
        waited = 0.0
        if self._copied:
            t0 = time.perf_counter()
            for copied in self._copied:
                copied.synchronize()
            waited = time.perf_counter() - t0
        self._copied.clear()
        for slots in self._held:
            self.audio.release(slots)
        self._held.clear()
        return waited

    def _frames(self, samples: Tensor, real_host: Tensor, real: Tensor, device: torch.device) -> Tensor:
        """The step's new mel frames, on `device`: pre-emphasis (as the offline front end
        computes it) and log-mel of every row in one call where `features` says.

        samples: (b, S) float32 rows from `SlotAudio.take` on the host, or from the rings on the
        device (one sample before the first window, then the windows); real: (b,) int64 on
        `device` (`real_host`: the same on the host), how many of a row's samples are the
        signal's (later ones, past its end or the row's own length, count as zeros).
        Returns (b, n_mels, (S - 1 - n_fft) // hop + 1) fp32."""
        logmel = self._feature_maker(device)
        at = logmel.featurizer.fb.device
        x = samples.to(at, non_blocking=True)
        real = real if at == real.device else real_host
        y = x[:, 1:] - logmel.dims.preemph * x[:, :-1]
        y = torch.where(torch.arange(y.shape[1], device=at)[None] < (real - 1)[:, None], y, 0.0)
        b = y.shape[0]
        if at.type == "cuda" and b:  # zero rows up to the bucket: few batch sizes for cuFFT
            y = torch.nn.functional.pad(y, (0, 0, 0, bucket_size(b, FEATURE_ROWS_PER_OCTAVE) - b))
        return logmel.frames(y)[:b].to(device, non_blocking=True)

    def _windows(self, frames: Tensor, rows: Tensor, index: Tensor) -> Tensor:
        """The step's encoder windows, assembled on the model's device, and each slot's tail moved on.

        frames: (b, n_mels, K) this step's new frames; rows: (b,) slots; index: (b, W + 9) from
        `_layout`. Returns mel (b, n_mels, W) fp32."""
        assert self._tail is not None
        b, n_mels, k = frames.shape
        w = self.geometry.window
        # Columns: the slot's 9 tail frames, the K new ones, one zero column for unused window cells.
        ext = torch.cat([self._tail.index_select(0, rows), frames, frames.new_zeros(b, n_mels, 1)], dim=2)
        mel = ext.gather(2, index[:, None, :w].expand(b, n_mels, w))
        self._tail.index_copy_(0, rows, ext.gather(2, index[:, None, w:].expand(b, n_mels, PRE_ENCODE_CACHE)))
        return mel

    def _feature_maker(self, device: torch.device) -> LogMel:
        """The log-mel module a step computes its frames with (follows the model's device)."""
        if self.features == "cpu" or device.type == "cpu":
            return self._logmel
        if self._device_logmel is None or self._device_logmel.featurizer.fb.device != device:
            self._device_logmel = copy.deepcopy(self._logmel).to(device)
        return self._device_logmel

    def results(self, streams: list[Stream], slots: np.ndarray, labels: np.ndarray, times: np.ndarray,
                lengths: np.ndarray, frames: np.ndarray) -> StepResults:
        """Advance the streams past a collected step part (launched on `slots`): its labels and
        times (b, capacity) int64, the first lengths[i] of row i valid, and its encoder frames
        (b,) per stream. A stream closed since the launch is not counted, nor its transcript kept
        (its slot may have a new stream already)."""
        width = int(lengths.max()) if lengths.size else 0
        decoded = self.audio.decoded
        start = decoded[slots]
        end = start + frames
        still = np.fromiter((s.slot for s in streams), np.int64, len(streams)) == slots
        decoded[slots[still]] = end[still]
        out = StepResults(labels[:, :width].copy(), times[:, :width].copy(), lengths.copy(), start, end)
        if self.keep_transcripts and width:
            for s, chunk, kept in zip(streams, out.chunks(), still.tolist()):
                if kept:
                    s.tokens.extend(chunk.tokens)
                    s.times.extend(chunk.times)
        return out

    def _reset_fresh(self, cache: EncoderCache, dec: DecoderState) -> None:
        """Start state in the rows of every slot opened since the last step: a few torch calls
        per step, however many streams opened (opening is on the engine thread's critical path)."""
        if not self._fresh:
            return
        device = cache.channel.device
        host = _host(device, (len(self._fresh),), torch.int64)
        host.numpy()[:] = list(self._fresh)
        rows = host.to(device, non_blocking=True)  # pinned: no wait for the step in flight
        self._fresh.clear()
        cache.channel.index_fill_(1, rows, 0.0)
        cache.time.index_fill_(1, rows, 0.0)
        cache.channel_len.index_fill_(0, rows, 0)
        if cache.head is not None:
            cache.head.index_fill_(0, rows, 0)
        if self._tail is not None:
            self._tail.index_fill_(0, rows, 0.0)
        dec.index_copy_(rows, self._start_row().expand(int(rows.shape[0])))

    def _start_row(self) -> DecoderState:
        """The after-start decoder row (the prediction net run on blank: an LSTM call), made once
        per search object and weights: keyed on each prediction-net and joint tensor's storage,
        version (in-place updates), device and dtype, so any move, cast or weight change remakes it."""
        key = (id(self.search), *((p.data_ptr(), p._version, p.device, p.dtype)
                                  for m in (self.model.decoder, self.model.joint) for p in m.parameters()))
        if self._start is None or self._start[0] != key:
            self._start = (key, self.search.initial_state(1))
        return self._start[1]


class _Part:
    """One launched part of a step: its labels and frame counts being copied to (pinned) host
    memory, and an event recorded after the copy."""

    def __init__(self, streams: list[Stream], slots: np.ndarray, hyps: BatchedHyps, enc_len: Tensor) -> None:
        self.streams, self.slots = streams, slots
        device = enc_len.device
        outputs = [hyps.labels, hyps.times, hyps.lengths, enc_len]
        if device.type == "cuda":
            outputs = [_host(device, tuple(t.shape), t.dtype).copy_(t, non_blocking=True) for t in outputs]
        self.done = _event(device)  # after the copies (None off CUDA)
        self.host = outputs  # on the host (once `done` has happened)


class Launched:
    """A step queued on the model's device, in one or more parts; `collect` waits for them, once.
    On CUDA, `started` and `ended` are timing events before its first and after its last work.
    `ring_bytes`: how much of the streams' rings its parts copy to the device (`ring_copy`: the
    rows' segments read from the mapped rings; where they cannot be, the slot range of a dense
    part, the rows' own segments of a sparse one); 0 without ring copies.
    `ring_wait_s`: how long its launch waited for the step before's copies from the rings
    (`Recognizer._release_rings`): a copy that has not happened by the next launch stalls it."""

    def __init__(self, rec: Recognizer, parts: list[_Part], device: torch.device,
                 started: torch.cuda.Event | None = None, order: list[int] | None = None,
                 ring_bytes: int = 0, ring_wait_s: float = 0.0) -> None:
        self._rec, self._parts, self.device = rec, parts, device
        self.started = started
        self.ring_bytes, self.ring_wait_s = ring_bytes, ring_wait_s
        self._order = order  # the parts hold streams[order[0]], streams[order[1]], ... (None: as given)
        self.ended = parts[-1].done if parts else None

    def device_s(self, previous: Launched | None) -> float | None:
        """Seconds the device spent on this step (once collected): from its start, or from the
        end of `previous` (the step before it on the device) if that was later, to its end.
        None off CUDA, or when the two steps ran on different devices (a migration between)."""
        if self.started is None or self.ended is None:
            return None
        span = self.started.elapsed_time(self.ended)
        if previous is not None and previous.ended is not None and previous.device == self.device:
            span = min(span, previous.ended.elapsed_time(self.ended))
        return max(0.0, span) / 1e3

    def done(self) -> bool:
        """Whether the device has finished the step (`collect` would not wait)."""
        return all(p.done is None or p.done.query() for p in self._parts)  # type: ignore[no-untyped-call]

    def collect(self) -> StepResults:
        """Wait for the step; row i of the results is the i-th stream's, in the order of `streams`."""
        out = []
        for p in self._parts:
            if p.done is not None:
                p.done.synchronize()
            labels, times, lengths, enc_len = (t.numpy() for t in p.host)
            out.append(self._rec.results(p.streams, p.slots, labels, times, lengths, enc_len))
        results = StepResults.joined(out)
        if self._order is not None:  # row j holds streams[order[j]]
            return results.rows(np.argsort(np.asarray(self._order, dtype=np.int64)))
        return results


def _layout(taken: np.ndarray, news: np.ndarray, slots: np.ndarray, w: int, k: int, out: np.ndarray) -> None:
    """Fill `out` (b, 4 + W + 9) int64 from what each stream's `SlotAudio.take` returned (`taken`:
    (b, 3) lead, tail, real) and its new frames (`news`, (b,)): window length, start, slot and real samples,
    then the gather index of its W window columns into [9 tail frames | K new frames | a zero
    column] (`Recognizer._windows`), then that of its next 9 tail frames. Vectorised."""
    lead, tail = taken[:, 0:1], taken[:, 1:2]
    new = news[:, None]
    out[:, 0:1], out[:, 1:2], out[:, 2], out[:, 3] = lead + new, lead - tail, slots, taken[:, 2]
    col = np.arange(w, dtype=np.int64)[None]
    src = col - lead + PRE_ENCODE_CACHE  # window column -> column of [tail | new]
    out[:, 4: 4 + w] = np.where((col >= lead - tail) & (col < lead + new), src, PRE_ENCODE_CACHE + k)
    out[:, 4 + w:] = new + np.arange(PRE_ENCODE_CACHE, dtype=np.int64)[None]


def _event(device: torch.device) -> torch.cuda.Event | None:
    """A timing event recorded now on `device`'s current stream (None off CUDA)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream(device))
    return event


def _gather_segments(rings: Tensor, slots: np.ndarray, at: np.ndarray, out: Tensor, order: np.ndarray) -> None:
    """The `out.shape[1]` samples of each ring `rings[slots[i]]` from position at[i] on (modulo
    the ring's length, around its end), into the rows of `out` (b, size), and in `order` (b,)
    the row of `out` that slot's went to. The segments that do not wrap around come first, in
    one copy (windows of the rings' flat storage); those that do, one by one (two slices each)."""
    m, size = rings.shape[1], out.shape[1]
    start = at % m
    whole = start + size <= m
    k = int(whole.sum())
    order[whole] = np.arange(k)
    order[~whole] = np.arange(k, slots.size)
    if k:
        flat = rings.view(-1)
        windows = flat.as_strided((flat.numel() - size + 1, size), (1, 1))  # row p: the samples from p on
        torch.index_select(windows, 0, torch.from_numpy(slots[whole] * m + start[whole]), out=out[:k])
    rows, dest = rings.numpy(), out.numpy()
    for row, slot, a in zip(range(k, slots.size), slots[~whole].tolist(), start[~whole].tolist()):
        dest[row, :m - a] = rows[slot, a:]
        dest[row, m - a:] = rows[slot, :size - (m - a)]


class _DeviceView:
    """A pinned host tensor as the CUDA array interface describes device memory: `torch.as_tensor`
    of it on a GPU is a tensor over the same bytes (its kernels read them over the bus)."""

    def __init__(self, host: Tensor) -> None:
        assert host.dtype == torch.float32 and host.is_contiguous()
        self.host = host  # the tensor made of it holds this object, and so the memory
        self.__cuda_array_interface__ = {"shape": tuple(host.shape), "typestr": "<f4", "strides": None,
                                         "data": (host.data_ptr(), False), "version": 3}


def _host(device: torch.device, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """A host tensor to fill and copy to `device`: pinned for a GPU, so that the copy does not
    wait for the GPU to finish earlier work (a copy from pageable memory does), and the whole
    step is queued before the labels are read back."""
    return torch.empty(shape, dtype=dtype, pin_memory=device.type == "cuda")


def _called_since(called: tuple[dict[int, float], dict[int, float]], since: float) -> tuple[list[int], list[int]]:
    enc, dec = ([size for size, at in sorted(part.items()) if at >= since] for part in called)
    return enc, dec
