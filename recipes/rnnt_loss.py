"""RNN-T loss: torchaudio's fused CUDA/CPU kernel when importable, else a pure-PyTorch forward
algorithm (autograd gives the gradient).

The lattice: `lp = log_softmax(logits)` over (B, T, U+1, V+1); from node (t, u) a blank moves to
(t+1, u) with lp[t, u, blank], label u+1 moves to (t, u+1) with lp[t, u, y[u]]. The loss is
-log P(y | x) = -(alpha[T-1, U] + lp[T-1, U, blank]).

The pure version loops over t; within a frame the label moves form a chain along u, solved in
closed form: alpha[t, u] = E[u] + logcumsumexp_k(a[k] - E[k]) with a = the blank arrivals and E
the running sum of label log-probs along u.
"""
from __future__ import annotations

import torch
from torch import Tensor

try:  # torchaudio is on the GPU image; it may not install elsewhere
    from torchaudio.functional import rnnt_loss as _torchaudio_rnnt_loss  # type: ignore[import-not-found, unused-ignore]
except (ImportError, OSError, RuntimeError):  # missing, or built for another torch
    _torchaudio_rnnt_loss = None

HAVE_TORCHAUDIO = _torchaudio_rnnt_loss is not None


def rnnt_loss(logits: Tensor, targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor,
              blank: int, reduction: str = "mean", use_torchaudio: bool | None = None) -> Tensor:
    """logits (B, T, U+1, V+1) unnormalised, float32; targets (B, U); lengths (B,).

    reduction: "mean" (over the batch), "sum" or "none". use_torchaudio: None = if available."""
    if use_torchaudio is None:
        use_torchaudio = HAVE_TORCHAUDIO
    if use_torchaudio:
        if _torchaudio_rnnt_loss is None:
            raise RuntimeError("torchaudio's rnnt_loss is not importable here")
        return _torchaudio_rnnt_loss(logits, targets.int(), logit_lengths.int(), target_lengths.int(),
                                     blank=blank, reduction=reduction, fused_log_softmax=True)
    return rnnt_loss_pytorch(logits, targets, logit_lengths, target_lengths, blank, reduction)


def rnnt_loss_pytorch(logits: Tensor, targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor,
                      blank: int, reduction: str = "mean") -> Tensor:
    """Pure-PyTorch RNN-T loss (same arguments as `rnnt_loss`), vectorised over batch and u."""
    b, t_max, u1, _ = logits.shape
    lp = logits.float().log_softmax(-1)
    blank_lp = lp[..., blank]  # (B, T, U+1)
    tgt = targets[:, : u1 - 1].long().clamp(min=0)
    emit_lp = lp[:, :, : u1 - 1].gather(3, tgt[:, None, :, None].expand(b, t_max, u1 - 1, 1))[..., 0]
    zero = lp.new_zeros(b, t_max, 1)
    cum_emit = torch.cat([zero, emit_lp.cumsum(2)], 2)  # E: (B, T, U+1)
    neg_inf = torch.finfo(lp.dtype).min
    arrive = torch.full((b, u1), neg_inf, device=lp.device, dtype=lp.dtype)
    arrive[:, 0] = 0.0  # alpha[0, 0] = 0: the start node, reached before any frame
    alphas = []
    alpha = arrive
    for t in range(t_max):
        if t > 0:
            arrive = alpha + blank_lp[:, t - 1]
        e = cum_emit[:, t]
        alpha = e + torch.logcumsumexp(arrive - e, dim=1)
        alphas.append(alpha)
    alpha_all = torch.stack(alphas, 1)  # (B, T, U+1)
    rows = torch.arange(b, device=lp.device)
    t_last = (logit_lengths.long() - 1).clamp(min=0)
    u_last = target_lengths.long()
    ll = alpha_all[rows, t_last, u_last] + blank_lp[rows, t_last, u_last]
    loss = -ll
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss
