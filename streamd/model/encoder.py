"""Cache-aware streaming FastConformer encoder (NeMo `ConformerEncoder`, chunked_limited attention)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from streamd.model.attention import RelPositionalEncoding, RelPositionMultiHeadAttention, SlotRows
from streamd.model.conformer import ConformerLayer
from streamd.model.dims import ModelDims
from streamd.model.subsampling import CausalSubsampling, subsampled_length

# Subsampled frames of the mel frames a step keeps (`dims.PRE_ENCODE_CACHE`) that it drops again: 1 + (9 - 1) // 8.
DROP_EXTRA_PRE_ENCODED = 2


@dataclass
class EncoderCache:
    """Per-stream encoder state, batch on dim 1 (dim 0 for `channel_len` and `head`).

    channel: what the attention keeps of the last C frames, in one of two layouts:
        (L, B, C, d) their normalised attention inputs (NeMo's `cache_last_channel`; `kv` False),
        or (L, B, C, 2d) their projected keys then values (`kv` True): a step then projects only
        its new frames (the serving layout).
    time: (L, B, d, K-1) depthwise-conv inputs of the last K-1 frames.
    channel_len: (B,) int64 valid frames in `channel` (saturates at C).
    head: None: `channel` is in time order, right-aligned (NeMo's layout; a batch of streams
        stepped on its own). Else (B,) int64: `channel` is a ring, row b's oldest frame at
        head[b] and the rest after it, wrapping (slot storage: a step writes only its chunk's
        frames back, over the oldest, instead of all C; the attention takes the keys in ring
        order, its positional scores and mask permuted to match).
    """

    channel: Tensor
    time: Tensor
    channel_len: Tensor
    kv: bool = False
    head: Tensor | None = None

    def to(self, device: torch.device, dtype: torch.dtype) -> EncoderCache:
        return EncoderCache(self.channel.to(device, dtype), self.time.to(device, dtype),
                            self.channel_len.to(device), self.kv,
                            None if self.head is None else self.head.to(device))

    def copy_(self, src: EncoderCache) -> None:
        """Copy `src` (same layout and shapes, any device and dtype) into these buffers."""
        if src.kv != self.kv or (src.head is None) != (self.head is None):
            raise ValueError("cannot copy between cache layouts (key/value or input, ring or time order)")
        self.channel.copy_(src.channel)
        self.time.copy_(src.time)
        self.channel_len.copy_(src.channel_len)
        if self.head is not None and src.head is not None:
            self.head.copy_(src.head)


def step_frames(mel_frames: int, drop_extra: int = DROP_EXTRA_PRE_ENCODED) -> int:
    """Encoder frames a streaming step of a `mel_frames`-wide mel window gives: the
    subsampling's, less `drop_extra` dropped."""
    return max(subsampled_length(mel_frames) - drop_extra, 0)


def ring_order(head: Tensor, c: int, t: int) -> Tensor:
    """(B, C + T) int64: the time index of each frame of a window whose first C frames are a
    ring with its oldest frame at `head` (B,), and whose last T are the chunk's (in time order):
    what the attention's scores and mask, computed in time order, are permuted by."""
    r = torch.arange(c + t, device=head.device)
    return torch.cat([(r[:c] - head[:, None]) % max(c, 1), r[c:].expand(head.shape[0], t)], dim=1)


def read_rings(channel: Tensor, rows: Tensor, out: Tensor, per_layer: bool | None = None) -> None:
    """out[:, i] = channel[:, rows[i]]: the slots' rings (L, S, C, w) into the front C frames of
    attention windows (L, n, C, w, a strided view). `per_layer` (None: on a GPU): one
    index_select a layer over the rows flattened to C * w, 8.6 ms against one call's 18.7 ms for
    5120 rows of FastConformer-L (17 layers, bf16, 160 ms) on an H100; on 2 CPU cores one call
    was 13 % faster (benchmarks/h100-2026-12-06)."""
    if not (channel.is_cuda if per_layer is None else per_layer):
        torch.index_select(channel, 1, rows, out=out)
        return
    layers, slots, c, w = channel.shape
    flat, n = channel.view(layers, slots, c * w), out.shape[1]
    for layer in range(layers):
        torch.index_select(flat[layer], 0, rows, out=out[layer].view(n, c * w))


def write_chunk(channel: Tensor, base: Tensor, head: Tensor, chunk: Tensor) -> None:
    """Write a step's frames `chunk` (L, B, T, w) into the rings of `channel` (L, S, C, w): row
    b's ring starts at frame base[b] of the flattened (L, S * C, w) view and its oldest frame is
    at head[b] (before this step); frame k of the chunk replaces the oldest but k, at
    (head + k) % C (of more than C new frames, the last C)."""
    n_layers, slots, c, w = channel.shape
    t = chunk.shape[2]
    if c == 0:  # no left context: nothing is kept
        return
    first = max(0, t - c)
    k = torch.arange(first, t, device=head.device)
    at = (base[:, None] + (head[:, None] + k) % c).reshape(-1)
    channel.view(n_layers, slots * c, w).index_copy_(1, at, chunk[:, :, first:].reshape(n_layers, -1, w))


class Workspace:
    """A buffer that `ConformerEncoder.streaming_forward` keeps its attention windows in from
    one step to the next: fresh blocks of tens of MB cost the CPU's allocator a map and page
    faults on every step, several times the copy itself. It grows to the largest step seen."""

    def __init__(self) -> None:
        self._buf: Tensor | None = None

    def take(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """A tensor of `shape` with `like`'s device and dtype (contents undefined)."""
        n = math.prod(shape)
        buf = self._buf
        if buf is None or buf.numel() < n or buf.device != like.device or buf.dtype != like.dtype:
            buf = self._buf = like.new_empty(n)
        return buf[:n].view(shape)

    def release(self) -> None:
        """Let the buffer go (it comes back at the next `take`)."""
        self._buf = None


class ConformerEncoder(nn.Module):
    """(B, n_mels, T) log-mel -> (B, T', d_model), one frame per 8 mel frames (80 ms at 16 kHz).

    The attention context, a [left, right] pair (in encoder frames) of `dims.att_context_sizes`,
    is an argument of every call: the caller (`streamd.engine.recognizer.Recognizer` when
    serving) owns the choice; the encoder holds no setting."""

    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.dims = dims
        self.pre_encode = CausalSubsampling(dims)
        self.pos_enc = RelPositionalEncoding(dims.d_model, dims.pos_emb_max_len, dims.xscaling)
        self.layers = nn.ModuleList(ConformerLayer(dims) for _ in range(dims.n_layers))

    def init_cache(self, batch: int, att_context: tuple[int, int], device: torch.device | str,
                   dtype: torch.dtype, kv: bool = True, ring: bool = False) -> EncoderCache:
        """Empty state for `batch` streams: C = the left context (att_context[0]) cached frames,
        as keys and values (`kv`, the default) or as NeMo's normalised inputs, in time order or
        as rings (`ring`: slot storage, for `streaming_forward`'s `rows` and `windows`; see
        `EncoderCache`)."""
        d = self.dims
        return EncoderCache(
            torch.zeros(d.n_layers, batch, att_context[0], d.d_model * (2 if kv else 1), device=device, dtype=dtype),
            torch.zeros(d.n_layers, batch, d.d_model, d.conv_kernel - 1, device=device, dtype=dtype),
            torch.zeros(batch, dtype=torch.long, device=device),
            kv,
            torch.zeros(batch, dtype=torch.long, device=device) if ring else None,
        )

    def forward(self, mel: Tensor, lengths: Tensor, att_context: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """Offline pass under the streaming (chunked_limited) mask of `att_context`.

        Args: mel (B, n_mels, T); lengths (B,). Returns (B, T', d) and (B,) lengths."""
        x, lengths = self.pre_encode(mel.to(self._dtype), lengths)
        x, pos = self.pos_enc(x, x.shape[1])
        pad_mask, att_mask = self._masks(x.shape[1], lengths, None, att_context)
        for layer in self.layers:
            x, _ = layer(x, pos, att_mask, pad_mask, None, None)
        return x, lengths

    def streaming_forward(self, mel: Tensor, lengths: Tensor, cache: EncoderCache, att_context: tuple[int, int],
                          drop_extra: int = DROP_EXTRA_PRE_ENCODED, start: Tensor | None = None,
                          full: bool = False, out: EncoderCache | None = None, rows: Tensor | None = None,
                          work: Workspace | None = None, windows: Tensor | None = None,
                          slots: SlotRows | None = None) -> tuple[Tensor, Tensor, EncoderCache]:
        """One cache-aware step.

        Each layer attends over a window of (C + T) frames: the C cached ones, then this chunk's
        T, which the layer writes in place. In time order (a batch of streams on its own) the
        window's last C frames are the next cache. Slot storage keeps rings (`EncoderCache.head`):
        the window's first C frames are the ring as stored, the scores and mask are permuted to
        it (`ring_order`), and only the chunk's frames go back, over the oldest (`write_chunk`).
        Where the attention kernel runs (`reads_slots`), a key/value ring is not copied at all:
        the windows hold only the chunk's T frames and the kernel reads the C cached ones from
        the slots (`SlotRows`).

        Args:
            mel: (B, n_mels, T_in): the previous step's last 9 mel frames then the new ones.
            lengths: (B,) valid mel frames of each row (from the start of the window).
            cache: the state returned by the previous step (or `init_cache`, same `att_context`):
                in time order, or, with `rows` or `windows`, rings (`init_cache(ring=True)`).
            att_context: the [left, right] attention context, one the model was trained for.
            drop_extra: subsampled frames to drop at the front (2; NeMo's first chunk uses 0).
            start: (B,) mel frames at the front that do not exist yet (16 on a stream's first
                step, 8 on the second at right context 0, else 0); they act as the causal zero
                padding of the offline pass. None = all exist.
            full: the caller knows that every row is complete (start all 0, lengths all T_in),
                which spares the subsampling's masking.
            rows: (B,) int64: `cache` holds many streams' slots (batch S) and row b is slot
                rows[b]; the step reads those slots (into the windows, or in place) and writes
                their next state back into them, in place (`cache` is returned).
            work: with `rows`, buffers reused across calls for the windows (`Workspace`).
            windows: with `out`: the caller's (L, B, C + T_out, d or 2d) windows, whose first C
                frames are the rows' rings, gathered there by the caller with their heads in
                `cache.head` (a CUDA graph's static buffers). The layers write the chunk's
                frames after them; `out`'s time, channel_len and head receive the next ones (its
                channel is not written: the caller puts the chunk's frames into its rings with
                `write_chunk`, and nothing else of a ring changes).
            slots: with `windows` of (L, B, T_out, 2d), the chunk's frames only: the slot rings
                (L, S, C, 2d) and each row's slot, the cached keys and values read in place
                (`cache.channel` is not read; its time, channel_len and head are the rows').
        Returns: (B, T_out, d), (B,) valid output frames, the next cache (with `windows`: `out`).
        """
        x, lengths = self.pre_encode(mel.to(self._dtype), lengths, start, full, drop_extra)
        c, t = att_context[0], x.shape[1]
        if (rows is not None or windows is not None) != (cache.head is not None):
            raise ValueError("rows= and windows= step slot storage, rings (init_cache(ring=True)); "
                             "a cache in time order is stepped on its own")
        channel_len, head = cache.channel_len, cache.head
        if rows is not None:
            channel_len = channel_len.index_select(0, rows)
            head = head.index_select(0, rows) if head is not None else None
        x, pos = self.pos_enc(x, c + t)
        pad_mask, att_mask = self._masks(c + t, lengths + c, c - channel_len, att_context)
        pad_mask, att_mask = pad_mask[:, c:], att_mask[:, c:]
        order = None
        if head is not None:
            order = ring_order(head, c, t)
            att_mask = att_mask.gather(2, order[:, None].expand(att_mask.shape))
        layers, width = cache.channel.shape[0], cache.channel.shape[-1]
        shape = (layers, x.shape[0], c + t, width)
        if windows is not None:
            if slots is not None:
                shape = (layers, x.shape[0], t, width)
            if out is None or out.head is None or rows is not None or tuple(windows.shape) != shape:
                raise ValueError(f"windows {tuple(windows.shape)} go with ring `out`, without `rows`, shaped {shape}")
            time = cache.time
        elif out is not None or slots is not None:
            raise ValueError("`out` and `slots` go with `windows`")
        elif rows is None:
            windows = cache.channel.new_empty(shape)
            windows[:, :, :c] = cache.channel
            time = cache.time
        else:
            if cache.kv and self.reads_slots(cache.channel.device, t):
                slots, shape = SlotRows(cache.channel, rows), (layers, x.shape[0], t, width)
            windows = work.take(shape, cache.channel) if work is not None else cache.channel.new_empty(shape)
            if slots is None:
                read_rings(cache.channel, rows, windows[:, :, :c])
            time = cache.time.index_select(1, rows)
        times = []
        for i, layer in enumerate(self.layers):
            x, tm = layer(x, pos, att_mask, pad_mask, windows[i], time[i], cache.kv, order,
                          None if slots is None else slots.layer(i))
            times.append(tm)
        channel_len = (channel_len + t).clamp(max=c)
        if head is None:
            return x, lengths, EncoderCache(windows[:, :, t:], torch.stack(times), channel_len, cache.kv)
        if rows is not None and cache.head is not None:
            write_chunk(cache.channel, rows * c, head, windows[:, :, windows.shape[2] - t:])
            cache.time.index_copy_(1, rows, torch.stack(times))
            cache.channel_len.index_copy_(0, rows, channel_len)
            cache.head.index_copy_(0, rows, (head + t) % max(c, 1))
            return x, lengths, cache
        assert out is not None and out.head is not None
        if out.kv != cache.kv:
            raise ValueError("the out buffers' cache layout differs from the cache's")
        torch.stack(times, out=out.time)
        out.channel_len.copy_(channel_len)
        out.head.copy_((head + t) % max(c, 1))
        return x, lengths, out

    def reads_slots(self, device: torch.device, frames: int) -> bool:
        """Whether a step of `frames` encoder frames on `device` attends with the kernel, which
        reads slot storage's cached keys and values in place (`SlotRows`; no window copy)."""
        attention: RelPositionMultiHeadAttention = self.layers[0].self_attn  # type: ignore[assignment]
        return attention.uses_kernel(device, frames)

    def attention_path(self) -> str:
        """How streaming steps attend where the encoder is: "kernel", "sdpa" or "explicit"
        (`RelPositionMultiHeadAttention.streaming_path`)."""
        layer: ConformerLayer = self.layers[0]  # type: ignore[assignment]
        return layer.self_attn.streaming_path(self.pre_encode.out.weight.device)

    @property
    def _dtype(self) -> torch.dtype:
        return self.pre_encode.out.weight.dtype

    def _masks(self, n: int, valid_end: Tensor, valid_start: Tensor | None, att_context: tuple[int, int]
               ) -> tuple[Tensor, Tensor]:
        """pad_mask (B, n) and att_mask (B, n, n), True = masked, over a key axis of n frames
        where frames [valid_start, valid_end) of each row exist, under `att_context`'s chunks."""
        left, right = att_context
        chunk = right + 1
        left_chunks = left // chunk if left >= 0 else 10000
        idx = torch.arange(n, device=valid_end.device)
        ci = torch.div(idx, chunk, rounding_mode="trunc")
        diff = ci[:, None] - ci[None, :]
        allowed = (diff >= 0) & (diff <= left_chunks)
        valid = idx[None] < valid_end[:, None]
        if valid_start is not None:
            valid = valid & (idx[None] >= valid_start[:, None])
        att = allowed[None] & valid[:, None, :] & valid[:, :, None]
        return ~valid, ~att
