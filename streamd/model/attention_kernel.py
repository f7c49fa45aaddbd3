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
given), masks, and weighs the values; products accumulate in fp32. The cached frames' keys and
values may be read where they are kept, slot storage's rings (a row's slot given): a serving step
then copies nothing into windows but the chunk's own frames.

The reference stays beside it (`_attend`'s two paths; tests compare). With the environment's
`TRITON_INTERPRET=1` (set before this module is imported: tests/conftest.py), Triton's interpreter
runs the kernel on the CPU: that is how CI tests it.
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
    def _window_attention(q_ptr, ck_ptr, cv_ptr, nk_ptr, nv_ptr, rows_ptr, p_ptr, u_ptr, w_ptr, mask_ptr, order_ptr,
                          out_ptr,
                          sq_b, sq_t, sq_h, sck_s, sck_n, sck_h, scv_s, scv_n, scv_h,
                          snk_b, snk_t, snk_h, snv_b, snv_t, snv_h, sp_r, sp_h,
                          sm_b, sm_t, so_b, so_t, so_h, sord_b, srow,
                          c, n, scale,
                          T: tl.constexpr, BT: tl.constexpr, DK: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr,
                          HAS_ROWS: tl.constexpr, HAS_ORDER: tl.constexpr, PRECISION: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        i = tl.arange(0, BT)  # query frames (T of them real)
        j = tl.arange(0, BN)  # window frames (n real: c cached, then new ones)
        r = tl.arange(0, BR)  # positional table rows (the first n + T - 1 are ever read)
        d = tl.arange(0, DK)
        query, key, row = i < T, j < n, r < n + T - 1
        cached, fresh = j < c, (j >= c) & key
        if HAS_ROWS:
            slot = tl.load(rows_ptr + b * srow).to(tl.int64)
        else:
            slot = b
        q = tl.load(q_ptr + b * sq_b + i[:, None] * sq_t + h * sq_h + d[None, :], mask=query[:, None], other=0.0)
        q = q.to(tl.float32)
        k = tl.where(cached[:, None],
                     tl.load(ck_ptr + slot * sck_s + j[:, None] * sck_n + h * sck_h + d[None, :],
                             mask=cached[:, None], other=0.0),
                     tl.load(nk_ptr + b * snk_b + (j - c)[:, None] * snk_t + h * snk_h + d[None, :],
                             mask=fresh[:, None], other=0.0))
        v = tl.where(cached[:, None],
                     tl.load(cv_ptr + slot * scv_s + j[:, None] * scv_n + h * scv_h + d[None, :],
                             mask=cached[:, None], other=0.0),
                     tl.load(nv_ptr + b * snv_b + (j - c)[:, None] * snv_t + h * snv_h + d[None, :],
                             mask=fresh[:, None], other=0.0))
        p = tl.load(p_ptr + r[:, None] * sp_r + h * sp_h + d[None, :], mask=row[:, None], other=0.0)
        u = tl.load(u_ptr + h * DK + d).to(tl.float32)
        w = tl.load(w_ptr + h * DK + d).to(tl.float32)
        content = tl.dot((q + u[None, :]).to(k.dtype), tl.trans(k), input_precision=PRECISION)  # (BT, BN)
        table = tl.dot((q + w[None, :]).to(p.dtype), tl.trans(p), input_precision=PRECISION)  # (BT, BR)
        if HAS_ORDER:
            order = tl.load(order_ptr + b * sord_b + j, mask=key, other=0)
        else:
            order = j
        # query i (time n - T + i) and key j (time order_j): the table row of their distance
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
                     mask: Tensor, order: Tensor | None, scale: float, new_keys: Tensor | None = None,
                     new_values: Tensor | None = None, rows: Tensor | None = None) -> Tensor:
    """Attention of T query frames over a window of n frames, per stream and head: the first C
    from `keys`/`values`, then (with `new_keys`/`new_values`) n - C more from those.

    Args:
        q: (B, T, H, dk) the query projections (before the u/v biases).
        keys, values: (B, C, H, dk) views (any strides with a contiguous last dim); with `rows`,
            (S, C, H, dk): row b's are slot rows[b]'s (slot storage, read in place).
        p: (R, H, dk) the positional projections of the table rows for relative distances
            n - 1 down to -(n - 1) (R = 2n - 1; rows beyond n + T - 2 are never read).
        bias_u, bias_v: (H, dk) Transformer-XL's content and position biases.
        mask: (B, T, n) bool, True = masked, in the keys' order.
        order: (B, n) int64 the time index of each key (a ring's order), or None: time order.
        scale: the scores' scale (1 / sqrt(dk)).
        new_keys, new_values: (B, n - C, H, dk) the window's last frames (the chunk's), or None.
        rows: (B,) int64 (any stride) the slot of each row in `keys`/`values`, or None: row b is b.
    Returns: (B, T, H, dk) in q's dtype; a query whose keys are all masked gives zeros.
    Raises KernelUnavailable when Triton cannot build it here (then `available` says False).
    """
    if triton is None:
        raise RuntimeError("the attention kernel needs Triton (torch's CUDA builds bring it)")
    b, t, h, dk = q.shape
    if new_keys is None or new_values is None:
        new_keys, new_values = keys, values  # never read: all n frames are the first C
    c = keys.shape[1]
    n = c + (new_keys.shape[1] if new_keys is not keys else 0)
    parts = (q, keys, values, new_keys, new_values, p)
    if not supports(dk) or min(x.stride(-1) for x in parts) != 1:
        raise ValueError("window_attention needs a power-of-two head size of at least 16 and contiguous heads")
    out = torch.empty((b, t, h, dk), device=q.device, dtype=q.dtype)
    m = mask.contiguous().view(torch.uint8)
    o = order if order is not None else m  # any pointer: not read without an order
    guard = torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext()
    kind = (q.device, q.dtype, t, n, dk, order is not None, rows is not None)
    try:
        with guard:  # Triton launches on the current device, whatever the tensors'
            _launch(q, keys, values, new_keys, new_values, rows if rows is not None else m, p, bias_u, bias_v, m, o,
                    out, c, n, scale, rows is not None, order is not None)
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


def _launch(q: Tensor, keys: Tensor, values: Tensor, new_keys: Tensor, new_values: Tensor, rows: Tensor, p: Tensor,
            bias_u: Tensor, bias_v: Tensor, m: Tensor, o: Tensor, out: Tensor, c: int, n: int, scale: float,
            has_rows: bool, has_order: bool) -> None:
    b, t, h, dk = q.shape
    _window_attention[(b, h)](
        q, keys, values, new_keys, new_values, rows, p, bias_u.contiguous(), bias_v.contiguous(), m, o, out,
        q.stride(0), q.stride(1), q.stride(2), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2), new_keys.stride(0), new_keys.stride(1),
        new_keys.stride(2), new_values.stride(0), new_values.stride(1), new_values.stride(2), p.stride(0), p.stride(1),
        m.stride(0), m.stride(1), out.stride(0), out.stride(1), out.stride(2),
        o.stride(0), rows.stride(0), c, n, scale,
        T=t, BT=max(16, triton.next_power_of_2(t)), DK=dk, BN=max(16, triton.next_power_of_2(n)),
        BR=max(16, triton.next_power_of_2(n + t - 1)), HAS_ROWS=has_rows, HAS_ORDER=has_order,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32")  # fp32 models: no TF32 in the products
