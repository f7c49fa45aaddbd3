"""Cache-aware streaming FastConformer encoder (NeMo `ConformerEncoder`, chunked_limited attention)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from streamd.model.attention import RelPositionalEncoding
from streamd.model.conformer import ConformerLayer
from streamd.model.dims import ModelDims
from streamd.model.subsampling import CausalSubsampling

# Subsampled frames of the mel frames a step keeps (`dims.PRE_ENCODE_CACHE`) that it drops again: 1 + (9 - 1) // 8.
DROP_EXTRA_PRE_ENCODED = 2


@dataclass
class EncoderCache:
    """Per-stream encoder state, batch on dim 1 (dim 0 for `channel_len`).

    channel: what the attention keeps of the last C frames, right-aligned, in one of two layouts:
        (L, B, C, d) their normalised attention inputs (NeMo's `cache_last_channel`; `kv` False),
        or (L, B, C, 2d) their projected keys then values (`kv` True): a step then projects only
        its new frames (the serving layout).
    time: (L, B, d, K-1) depthwise-conv inputs of the last K-1 frames.
    channel_len: (B,) int64 valid frames in `channel` (saturates at C).
    """

    channel: Tensor
    time: Tensor
    channel_len: Tensor
    kv: bool = False

    def to(self, device: torch.device, dtype: torch.dtype) -> EncoderCache:
        return EncoderCache(self.channel.to(device, dtype), self.time.to(device, dtype),
                            self.channel_len.to(device), self.kv)

    def copy_(self, src: EncoderCache) -> None:
        """Copy `src` (same layout and shapes, any device and dtype) into these buffers."""
        if src.kv != self.kv:
            raise ValueError("cannot copy between the key/value and the input cache layouts")
        self.channel.copy_(src.channel)
        self.time.copy_(src.time)
        self.channel_len.copy_(src.channel_len)


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
                   dtype: torch.dtype, kv: bool = True) -> EncoderCache:
        """Empty state for `batch` streams: C = the left context (att_context[0]) cached frames,
        as keys and values (`kv`, the default) or as NeMo's normalised inputs (see `EncoderCache`)."""
        d = self.dims
        return EncoderCache(
            torch.zeros(d.n_layers, batch, att_context[0], d.d_model * (2 if kv else 1), device=device, dtype=dtype),
            torch.zeros(d.n_layers, batch, d.d_model, d.conv_kernel - 1, device=device, dtype=dtype),
            torch.zeros(batch, dtype=torch.long, device=device),
            kv,
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
                          work: Workspace | None = None, windows: Tensor | None = None
                          ) -> tuple[Tensor, Tensor, EncoderCache]:
        """One cache-aware step.

        Each layer attends over a window of (C + T) frames: the C cached ones, then this chunk's
        T, which the layer writes in place, so the window's last C frames are the next cache.

        Args:
            mel: (B, n_mels, T_in): the previous step's last 9 mel frames then the new ones.
            lengths: (B,) valid mel frames of each row (from the start of the window).
            cache: the state returned by the previous step (or `init_cache`, same `att_context`).
            att_context: the [left, right] attention context, one the model was trained for.
            drop_extra: subsampled frames to drop at the front (2; NeMo's first chunk uses 0).
            start: (B,) mel frames at the front that do not exist yet (16 on a stream's first
                step, 8 on the second at right context 0, else 0); they act as the causal zero
                padding of the offline pass. None = all exist.
            full: the caller knows that every row is complete (start all 0, lengths all T_in),
                which spares the subsampling's masking.
            out: buffers (same layout and shapes as `cache`, not overlapping it) to write the
                next cache into; returned as the next cache. None = fresh tensors (the channel
                cache then a view of the windows).
            rows: (B,) int64: `cache` holds many streams' slots (batch S) and row b is slot
                rows[b]; the step reads those slots straight into the windows and writes their
                next state back into them, in place (`cache` is returned, `out` is not used).
            work: with `rows`, buffers reused across calls for the windows (`Workspace`).
            windows: with `out`: the caller's (L, B, C + T_out, d or 2d) windows, whose first C
                frames are `cache.channel` (gathered there by the caller) and whose last C frames
                are `out.channel`: the layers work in them in place and no channel cache is
                copied (a CUDA graph's static buffers: one window buffer, not an input and an
                output cache beside windows in the graph's pool).
        Returns: (B, T_out, d), (B,) valid output frames, the next cache.
        """
        x, lengths = self.pre_encode(mel.to(self._dtype), lengths, start, full)
        if drop_extra:
            x = x[:, drop_extra:]
            lengths = (lengths - drop_extra).clamp(min=0)
        c, t = att_context[0], x.shape[1]
        channel_len = cache.channel_len if rows is None else cache.channel_len.index_select(0, rows)
        x, pos = self.pos_enc(x, c + t)
        pad_mask, att_mask = self._masks(c + t, lengths + c, c - channel_len, att_context)
        pad_mask, att_mask = pad_mask[:, c:], att_mask[:, c:]
        shape = (cache.channel.shape[0], x.shape[0], c + t, cache.channel.shape[-1])
        in_place = windows is not None
        if windows is not None:
            if out is None or rows is not None or tuple(windows.shape) != shape:
                raise ValueError(f"windows {tuple(windows.shape)} go with `out`, without `rows`, shaped {shape}")
            time = cache.time
        elif rows is None:
            windows = cache.channel.new_empty(shape)
            windows[:, :, :c] = cache.channel
            time = cache.time
        else:
            windows = work.take(shape, cache.channel) if work is not None else cache.channel.new_empty(shape)
            torch.index_select(cache.channel, 1, rows, out=windows[:, :, :c])
            time = cache.time.index_select(1, rows)
        times = []
        for i, layer in enumerate(self.layers):
            x, tm = layer(x, pos, att_mask, pad_mask, windows[i], time[i], cache.kv)
            times.append(tm)
        channel_len = (channel_len + t).clamp(max=c)
        if rows is not None:
            cache.channel.index_copy_(1, rows, windows[:, :, t:])
            cache.time.index_copy_(1, rows, torch.stack(times))
            cache.channel_len.index_copy_(0, rows, channel_len)
            return x, lengths, cache
        if out is None:
            return x, lengths, EncoderCache(windows[:, :, t:], torch.stack(times), channel_len, cache.kv)
        if out.kv != cache.kv:
            raise ValueError("the out buffers' cache layout differs from the cache's")
        if not in_place:
            out.channel.copy_(windows[:, :, t:])
        torch.stack(times, out=out.time)
        out.channel_len.copy_(channel_len)
        return x, lengths, out

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
