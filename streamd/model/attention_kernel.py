"""The streaming step's attention in one Triton kernel: a few query frames per stream attend over
that stream's window of keys and values (cached frames in ring order, then the chunk's), with
Transformer-XL relative positions, and nothing in between goes through memory.

`RelPositionMultiHeadAttention._attend` computes the same function in ~20 operations (the
positional scores as a matmul over the whole table, then pad, reshape, slice, a gather into ring
order, scale, mask, then `scaled_dot_product_attention`); at thousands of streams of 2 query frames
each of them is a kernel over tens of MB, and the flash kernels tile queries by 64 or more, most
of which are empty here. This kernel runs one program per (stream, head): it reads the stream's
keys and values once, multiplies the queries with them and with the positional table rows they
can reach, picks each key's positional score by its relative distance in time (its ring order
given), masks, and weighs the values; products accumulate in fp32.

The reference stays beside it (`_attend`'s two paths; tests compare). With the environment's
`TRITON_INTERPRET=1` (set before this module is imported), Triton's interpreter runs the kernel
on the CPU: that is how CI tests it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU build of torch comes without Triton: the reference path serves
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
log = logging.getLogger("streamd.engine")
broken: str | None = None  # why the kernel failed to build in this process (it is not tried again)
_built: set[tuple[object, ...]] = set()  # the specialisations launched once: a later failure is no build failure


class KernelUnavailable(RuntimeError):
    """The kernel cannot be built for this GPU or Triton: callers take the reference path."""


def supports(head_size: int) -> bool:
    """Whether the kernel handles heads of this size (its matrix products need 16 or more)."""
    return head_size >= 16 and not head_size & (head_size - 1)


def available(device: torch.device) -> bool:
    """Whether the kernel can run for tensors on `device`: CUDA with Triton on a GPU with bf16
    matrix units (compute capability 8.0 or later), or Triton's interpreter on the CPU; and it
    has not failed to build in this process."""
    if triton is None or broken is not None:
        return False
    if device.type == "cuda":
        return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= (8, 0)
    return INTERPRET and device.type == "cpu"


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


if triton is not None:
    @triton.jit
    def _window_attention(q_ptr, k_ptr, v_ptr, p_ptr, u_ptr, w_ptr, mask_ptr, order_ptr, out_ptr,
                          sq_b, sq_t, sq_h, sk_b, sk_n, sk_h, sv_b, sv_n, sv_h, sp_r, sp_h,
                          sm_b, sm_t, so_b, so_t, so_h, sord_b,
                          n, scale,
                          T: tl.constexpr, BT: tl.constexpr, DK: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr,
                          HAS_ORDER: tl.constexpr, PRECISION: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        i = tl.arange(0, BT)  # query frames (T of them real)
        j = tl.arange(0, BN)  # window frames (n real)
        r = tl.arange(0, BR)  # positional table rows (the first n + T - 1 are ever read)
        d = tl.arange(0, DK)
        query, key, row = i < T, j < n, r < n + T - 1
        q = tl.load(q_ptr + b * sq_b + i[:, None] * sq_t + h * sq_h + d[None, :], mask=query[:, None], other=0.0)
        q = q.to(tl.float32)
        k = tl.load(k_ptr + b * sk_b + j[:, None] * sk_n + h * sk_h + d[None, :], mask=key[:, None], other=0.0)
        v = tl.load(v_ptr + b * sv_b + j[:, None] * sv_n + h * sv_h + d[None, :], mask=key[:, None], other=0.0)
        p = tl.load(p_ptr + r[:, None] * sp_r + h * sp_h + d[None, :], mask=row[:, None], other=0.0)
        u = tl.load(u_ptr + h * DK + d).to(tl.float32)
        w = tl.load(w_ptr + h * DK + d).to(tl.float32)
        content = tl.dot((q + u[None, :]).to(k.dtype), tl.trans(k), input_precision=PRECISION)  # (BT, BN)
        table = tl.dot((q + w[None, :]).to(p.dtype), tl.trans(p), input_precision=PRECISION)  # (BT, BR)
        if HAS_ORDER:
            order = tl.load(order_ptr + b * sord_b + j, mask=key, other=0)
        else:
            order = j
        # query i (time C + i) and key j (time order_j): the table row of their distance
        at = order[None, :] + (T - 1 - i)[:, None]
        position = tl.gather(table, tl.minimum(tl.maximum(at, 0), BR - 1).to(tl.int32), axis=1)
        masked = tl.load(mask_ptr + b * sm_b + i[:, None] * sm_t + j[None, :],
                         mask=query[:, None] & key[None, :], other=1) != 0
        score = tl.where(masked, -1.0e30, (content + position) * scale)
        weight = tl.where(masked, 0.0, tl.exp(score - tl.max(score, axis=1)[:, None]))
        total = tl.sum(weight, axis=1)
        out = tl.dot(weight.to(v.dtype), v, input_precision=PRECISION) / tl.maximum(total, 1e-30)[:, None]
        tl.store(out_ptr + b * so_b + i[:, None] * so_t + h * so_h + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=query[:, None])  # a query whose keys are all masked: weights 0, output 0


def window_attention(q: Tensor, keys: Tensor, values: Tensor, p: Tensor, bias_u: Tensor, bias_v: Tensor,
                     mask: Tensor, order: Tensor | None, scale: float) -> Tensor:
    """Attention of T query frames over n = C + T window frames, per stream and head.

    Args:
        q: (B, T, H, dk) the query projections (before the u/v biases).
        keys, values: (B, n, H, dk) views (any strides with a contiguous last dim).
        p: (R, H, dk) the positional projections of the table rows for relative distances
            n - 1 down to -(n - 1) (R = 2n - 1; rows beyond n + T - 2 are never read).
        bias_u, bias_v: (H, dk) Transformer-XL's content and position biases.
        mask: (B, T, n) bool, True = masked, in the keys' order.
        order: (B, n) int64 the time index of each key (a ring's order), or None: time order.
        scale: the scores' scale (1 / sqrt(dk)).
    Returns: (B, T, H, dk) in q's dtype; a query whose keys are all masked gives zeros.
    Raises KernelUnavailable when Triton cannot build it here (then `available` says False).
    """
    if triton is None:
        raise RuntimeError("the attention kernel needs Triton (torch's CUDA builds bring it)")
    b, t, h, dk = q.shape
    n = keys.shape[1]
    if not supports(dk) or min(q.stride(-1), keys.stride(-1), values.stride(-1), p.stride(-1)) != 1:
        raise ValueError("window_attention needs a power-of-two head size of at least 16 and contiguous heads")
    out = torch.empty((b, t, h, dk), device=q.device, dtype=q.dtype)
    m = mask.contiguous().view(torch.uint8)
    o = order if order is not None else m  # any pointer: not read without an order
    guard = torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext()
    kind = (q.device, q.dtype, t, n, dk, order is not None)
    try:
        with guard:  # Triton launches on the current device, whatever the tensors'
            _launch(q, keys, values, p, bias_u, bias_v, m, o, out, n, scale, order is not None)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:
        if kind in _built:
            raise
        # Its first launch builds it: Triton's compile errors, too little shared memory, ptxas, no C
        # compiler for the launcher, an unwritable TRITON_CACHE_DIR. Never again in this process.
        global broken
        broken = f"{type(e).__name__}: {str(e)[:300]}"
        log.warning("attention kernel unavailable (%s): attention runs on the reference path", broken)
        raise KernelUnavailable(broken) from e
    _built.add(kind)
    return out


def _launch(q: Tensor, keys: Tensor, values: Tensor, p: Tensor, bias_u: Tensor, bias_v: Tensor, m: Tensor,
            o: Tensor, out: Tensor, n: int, scale: float, has_order: bool) -> None:
    b, t, h, dk = q.shape
    _window_attention[(b, h)](
        q, keys, values, p, bias_u.contiguous(), bias_v.contiguous(), m, o, out,
        q.stride(0), q.stride(1), q.stride(2), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2), p.stride(0), p.stride(1),
        m.stride(0), m.stride(1), out.stride(0), out.stride(1), out.stride(2),
        o.stride(0), n, scale,
        T=t, BT=max(16, triton.next_power_of_2(t)), DK=dk, BN=max(16, triton.next_power_of_2(n)),
        BR=max(16, triton.next_power_of_2(n + t - 1)), HAS_ORDER=has_order,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32")  # fp32 models: no TF32 in the products
