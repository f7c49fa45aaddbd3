"""Relative-position multi-head self-attention (Transformer-XL style, NeMo `RelPositionMultiHeadAttention`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

MASKED_SCORE = -10000.0  # NeMo fills masked scores with -1e4 (not -inf): fully masked rows give 0
KERNEL_MAX_QUERIES = 16  # the Triton kernel serves streaming steps (a chunk's few frames), not offline passes


class RelPositionalEncoding(nn.Module):
    """Scales x by sqrt(d) and returns the sinusoidal table rows for relative offsets
    +(n-1) ... -(n-1). The embedding is never added to x."""

    pe: Tensor

    def __init__(self, d_model: int, max_len: int, xscaling: bool) -> None:
        super().__init__()
        self.d_model = d_model
        self.xscale = math.sqrt(d_model) if xscaling else 1.0
        self.register_buffer("pe", self._table(max_len), persistent=False)

    def _table(self, length: int) -> Tensor:
        """(2*length - 1, d) rows for positions length-1 down to -(length-1), computed in fp32."""
        pos = torch.arange(length - 1, -length, -1, dtype=torch.float32).unsqueeze(1)
        div = torch.exp(torch.arange(0, self.d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / self.d_model))
        pe = torch.zeros(pos.shape[0], self.d_model)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        return pe

    def forward(self, x: Tensor, n_keys: int) -> tuple[Tensor, Tensor]:
        """x: (B, T, d). Returns scaled x and pos_emb (1, 2*n_keys - 1, d) in x's dtype."""
        length = (self.pe.shape[0] + 1) // 2
        if n_keys > length:  # longer than any input seen: grow the table (offline, > 400 s)
            self.pe = self._table(n_keys).to(self.pe.device)
            length = n_keys
        pos = self.pe[length - n_keys: length + n_keys - 1].to(x.dtype)
        return x * self.xscale, pos.unsqueeze(0)


@dataclass(frozen=True)
class SlotRows:
    """Where a batch's cached keys and values are read in place (by the attention kernel):
    row b's C frames are slot rows[b] of `rings`, (S, C, 2d) keys then values for one layer,
    or (L, S, C, 2d) for all of them (`layer`)."""

    rings: Tensor
    rows: Tensor  # (B,) int64

    def layer(self, i: int) -> SlotRows:
        return SlotRows(self.rings[i], self.rows)


class RelPositionMultiHeadAttention(nn.Module):
    """Self-attention whose keys/values may be preceded by cached frames: given as their
    normalised inputs (`forward`, NeMo's cache) or as their projected keys and values
    (`forward_cached`, which projects only the new frames).

    Two paths compute the same scores: the explicit one (NeMo's matmuls and softmax; the CPU's and
    the reference) and a fused one (`scaled_dot_product_attention` with the positional term as an
    additive mask, NeMo's `use_pytorch_sdpa` path), used on CUDA. With a few query frames per
    stream and many streams, the explicit matmuls spend most of their time copying keys, values
    and the batch-expanded positional table into contiguous batches; the fused kernel reads them
    in place. `fused`: None = by device (fused on CUDA), True/False = always/never.

    On CUDA with Triton, a streaming step's attention (at most KERNEL_MAX_QUERIES query frames)
    runs as one kernel instead (`attention_kernel`: positional scores by relative distance, ring
    order, masks and softmax without going through memory). `kernel`: None = there, without
    autograd; True = wherever Triton runs (its CPU interpreter in tests); False = never. A GPU or
    Triton build the kernel fails to compile for turns it off for the process (logged), not the
    step."""

    fused: bool | None = None
    kernel: bool | None = None

    def __init__(self, d_model: int, n_heads: int, bias: bool) -> None:
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.linear_q = nn.Linear(d_model, d_model, bias=bias)
        self.linear_k = nn.Linear(d_model, d_model, bias=bias)
        self.linear_v = nn.Linear(d_model, d_model, bias=bias)
        self.linear_out = nn.Linear(d_model, d_model, bias=bias)
        self.linear_pos = nn.Linear(d_model, d_model, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(n_heads, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(n_heads, self.d_k))

    def forward(self, query: Tensor, keys: Tensor, pos_emb: Tensor, mask: Tensor, order: Tensor | None = None
                ) -> Tensor:
        """Args:
            query: (B, T, d) normalised input of this chunk.
            keys: (B, n, d) = cat(cache, query) along time (n = cache + T).
            pos_emb: (1, 2n - 1, d); mask: (B, T, n) bool, True = masked (in the keys' order).
            order: (B, n) int64 the time index of each key, when they are not in time order (a
                ring cache's): the positional scores are permuted to it. None: time order.
        Returns: (B, T, d)."""
        return self._attend(query, self.linear_k(keys), self.linear_v(keys), pos_emb, mask, order)

    def forward_cached(self, query: Tensor, window: Tensor, pos_emb: Tensor, mask: Tensor,
                       order: Tensor | None = None, slots: SlotRows | None = None) -> Tensor:
        """The same attention with the cached frames already projected: only the query frames go
        through `linear_k` and `linear_v`. Relative positions enter through `linear_pos` and the
        u/v biases, never through the keys, so a frame's key and value do not change as it ages.

        Args: window: (B, n, 2d) whose first C = n - T frames hold the cached frames' keys then
        values (in time order, or a ring's: `order`); the query's keys and values are written
        into its last T frames (in place: nothing is concatenated). With `slots`, window is
        (B, T, 2d), the chunk's frames only, and the C cached ones are read where they are kept
        (the kernel reads them in place; the reference paths gather them). The rest as `forward`.
        Returns: (B, T, d)."""
        t, d = query.shape[1], window.shape[-1] // 2
        new = window[:, window.shape[1] - t:]
        new[..., :d] = self.linear_k(query)
        new[..., d:] = self.linear_v(query)
        return self._attend(query, window[..., :d], window[..., d:], pos_emb, mask, order, slots)

    def _attend(self, query: Tensor, keys: Tensor, values: Tensor, pos_emb: Tensor, mask: Tensor,
                order: Tensor | None, slots: SlotRows | None = None) -> Tensor:
        """Scores and outputs from the query's input and the projected (B, n, d) keys and values
        (in time order, or in `order`'s: attention weighs keys and values as a set, so only the
        positional term, computed by relative distance in time, needs permuting). With `slots`,
        keys and values are the window's last frames and its first C are the slots' (SlotRows)."""
        b, t, _ = query.shape
        q = self.linear_q(query).view(b, t, self.h, self.d_k)
        p = self.linear_pos(pos_emb).view(-1, self.h, self.d_k)  # (2n-1, H, dk)
        scale = 1.0 / math.sqrt(self.d_k)
        if self._kernel(query):
            from streamd.model.attention_kernel import KernelUnavailable, window_attention
            try:
                if slots is None:
                    out = window_attention(q, self._heads(keys), self._heads(values), p, self.pos_bias_u,
                                           self.pos_bias_v, mask, order, scale)
                else:
                    d = keys.shape[-1]
                    out = window_attention(q, self._heads(slots.rings[..., :d]), self._heads(slots.rings[..., d:]), p,
                                           self.pos_bias_u, self.pos_bias_v, mask, order, scale, self._heads(keys),
                                           self._heads(values), slots.rows)
            except KernelUnavailable:
                pass  # logged once; this process attends on the reference path from now on
            else:
                return self.linear_out(out.view(b, t, self.h * self.d_k))
        if slots is not None:  # the reference paths: the cached frames gathered in front
            d = keys.shape[-1]
            cached = slots.rings.index_select(0, slots.rows)
            keys, values = torch.cat([cached[..., :d], keys], dim=1), torch.cat([cached[..., d:], values], dim=1)
        n = keys.shape[1]
        k = keys.view(b, n, self.h, self.d_k).transpose(1, 2)  # (B, H, n, dk)
        v = values.view(b, n, self.h, self.d_k).transpose(1, 2)
        fused = query.is_cuda if self.fused is None else self.fused
        if fused:
            # bd as one matmul per head over all streams' queries: (H, B*T, dk) @ (H, dk, 2n-1).
            qv = (q + self.pos_bias_v).permute(2, 0, 1, 3).reshape(self.h, b * t, self.d_k)
            bd = torch.matmul(qv, p.permute(1, 2, 0)).view(self.h, b, t, -1).transpose(0, 1)
            bias = (_in_order(rel_shift(bd)[..., :n], order) * scale).masked_fill(mask.unsqueeze(1), MASKED_SCORE)
            out = nn.functional.scaled_dot_product_attention((q + self.pos_bias_u).transpose(1, 2), k, v,
                                                             attn_mask=bias, scale=scale)
            out = out.masked_fill(mask.all(-1)[:, None, :, None], 0.0)  # fully masked rows give 0
        else:
            ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))  # (B, H, T, n)
            bd = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.permute(1, 2, 0).unsqueeze(0))  # (B, H, T, 2n-1)
            scores = (ac + _in_order(rel_shift(bd)[..., :n], order)) / math.sqrt(self.d_k)
            m = mask.unsqueeze(1)
            attn = torch.softmax(scores.masked_fill(m, MASKED_SCORE), dim=-1).masked_fill(m, 0.0)
            out = torch.matmul(attn, v)
        return self.linear_out(out.transpose(1, 2).reshape(b, t, self.h * self.d_k))

    def _heads(self, x: Tensor) -> Tensor:
        """(..., d) -> (..., H, dk), a view."""
        return x.view(*x.shape[:-1], self.h, self.d_k)

    def streaming_path(self, device: torch.device) -> str:
        """How a streaming step's attention runs on `device` (without autograd): "kernel"
        (Triton), "sdpa" (the fused path) or "explicit" (NeMo's matmuls)."""
        if self._kernel_for(device, 1, grad=False):
            return "kernel"
        return "sdpa" if (device.type == "cuda" if self.fused is None else self.fused) else "explicit"

    def uses_kernel(self, device: torch.device, queries: int) -> bool:
        """Whether a call with `queries` query frames on `device` runs the Triton kernel now
        (under the caller's autograd mode; see the class docstring)."""
        return self._kernel_for(device, queries, torch.is_grad_enabled())

    def _kernel(self, query: Tensor) -> bool:
        return self.uses_kernel(query.device, query.shape[1])

    def _kernel_for(self, device: torch.device, queries: int, grad: bool) -> bool:
        if self.kernel is False or queries > KERNEL_MAX_QUERIES:
            return False
        if self.kernel is None and (device.type != "cuda" or grad):
            return False
        from streamd.model import attention_kernel  # imports Triton: only where a step may use it
        return attention_kernel.supports(self.d_k) and (self.kernel is True or attention_kernel.available(device))


def _in_order(scores: Tensor, order: Tensor | None) -> Tensor:
    """(B, H, T, n) scores over keys in time order, permuted to keys in `order` (B, n)."""
    if order is None:
        return scores
    return scores.gather(-1, order[:, None, None, :].expand(scores.shape))


def rel_shift(x: Tensor) -> Tensor:
    """Turn scores indexed by table row into scores indexed by relative distance: (B, H, T, P)."""
    b, h, t, p = x.shape
    x = nn.functional.pad(x, (1, 0)).view(b, h, p + 1, t)
    return x[:, :, 1:].reshape(b, h, t, p)
