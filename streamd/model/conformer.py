"""One FastConformer layer (pre-LN macaron) with explicit attention and conv caches."""
from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from streamd.model.attention import RelPositionMultiHeadAttention, SlotRows
from streamd.model.dims import ModelDims


class FeedForward(nn.Module):
    def __init__(self, d: int, hidden: int, bias: bool) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d, hidden, bias=bias)
        self.linear2 = nn.Linear(hidden, d, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.silu(self.linear1(x)))


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over channels of a (B, C, T) tensor (NeMo's conv `layer_norm`)."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class CausalConvModule(nn.Module):
    """pointwise(d->2d) -> GLU -> zero pads -> causal depthwise (cache of K-1 frames) -> norm ->
    SiLU -> pointwise. The norm keeps NeMo's name `batch_norm` whatever its type."""

    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        d, k, bias = dims.d_model, dims.conv_kernel, dims.use_bias
        self.context = k - 1
        self.pointwise_conv1 = nn.Conv1d(d, 2 * d, 1, bias=bias)
        self.depthwise_conv = nn.Conv1d(d, d, k, groups=d, bias=bias)
        if dims.conv_norm == "layer_norm":
            self.batch_norm: nn.Module = ChannelLayerNorm(d)
        else:
            self.batch_norm = nn.BatchNorm1d(d)
        self.pointwise_conv2 = nn.Conv1d(d, d, 1, bias=bias)

    def forward(self, x: Tensor, pad_mask: Tensor, cache: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, d); pad_mask: (B, T) True = padding; cache: (B, d, K-1) or None.
        Returns (B, T, d) and the next cache (last K-1 depthwise inputs).

        The pointwise convs run as linears over (B, T, d) (their weights viewed as (out, in)): the
        same products as a kernel-1 conv, but one plain GEMM instead of cuDNN's conv kernels and
        layout changes, which at many streams of a few frames cost 20x the GEMM."""
        w1, w2 = self.pointwise_conv1.weight, self.pointwise_conv2.weight
        y = F.glu(F.linear(x, w1.squeeze(-1), self.pointwise_conv1.bias), dim=-1)
        y = y.masked_fill(pad_mask.unsqueeze(-1), 0.0).transpose(1, 2)  # (B, d, T)
        if cache is None:
            y = F.pad(y, (self.context, 0))
            next_cache = None
        else:
            y = torch.cat([cache, y], dim=-1)
            next_cache = y[:, :, -self.context:]
        y = F.silu(self.batch_norm(self.depthwise_conv(y)))
        return F.linear(y.transpose(1, 2), w2.squeeze(-1), self.pointwise_conv2.bias), next_cache


class ConformerLayer(nn.Module):
    """x + FF/2 -> + MHSA -> + Conv -> + FF/2 -> LayerNorm."""

    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        d, bias = dims.d_model, dims.use_bias
        self.norm_feed_forward1 = nn.LayerNorm(d)
        self.feed_forward1 = FeedForward(d, d * dims.ff_expansion, bias)
        self.norm_conv = nn.LayerNorm(d)
        self.conv = CausalConvModule(dims)
        self.norm_self_att = nn.LayerNorm(d)
        self.self_attn = RelPositionMultiHeadAttention(d, dims.n_heads, bias)
        self.norm_feed_forward2 = nn.LayerNorm(d)
        self.feed_forward2 = FeedForward(d, d * dims.ff_expansion, bias)
        self.norm_out = nn.LayerNorm(d)

    def forward(self, x: Tensor, pos_emb: Tensor, att_mask: Tensor, pad_mask: Tensor,
                window: Tensor | None, cache_time: Tensor | None, kv: bool = False,
                order: Tensor | None = None, slots: SlotRows | None = None) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, d); window: (B, C + T, w) whose first C frames hold what the attention keeps
        of earlier frames: their normalised inputs (w = d) or, with `kv`, their keys then values
        (w = 2d); this chunk's own are written into its last T frames, in place. With `slots`
        (and `kv`): window is (B, T, 2d) and the C cached frames are the slots' (read in place).
        cache_time: (B, d, K-1). order: (B, C + T) the time index of each window frame when the
        cached ones are a ring (`encoder.ring_order`; None: time order, and the window's last C
        frames are the next cache). Returns x and the next time cache (None without caches)."""
        x = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))
        xn = self.norm_self_att(x)
        if window is None:
            att = self.self_attn(xn, xn, pos_emb, att_mask)
        elif kv:
            att = self.self_attn.forward_cached(xn, window, pos_emb, att_mask, order, slots)
        else:
            window[:, window.shape[1] - xn.shape[1]:] = xn
            att = self.self_attn(xn, window, pos_emb, att_mask, order)
        x = x + att
        conv, next_time = self.conv(self.norm_conv(x), pad_mask, cache_time)
        x = x + conv
        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        return self.norm_out(x), next_time
