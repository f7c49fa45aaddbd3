"""Causal dw_striding subsampling (x8), NeMo `ConvSubsampling` with `causal_downsampling: true`."""
from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from streamd.model.dims import ModelDims

# Each 3x3 stride-2 conv is zero-padded left 2 / right 1 on time AND frequency (NeMo CausalConv2D).
# Computed as the conv's own symmetric padding of 2 with the extra last row/column cut off: the
# windows are the same (left padding 2), and no padded copy of the activation is made.
CAUSAL_LEFT_PAD = 2


Length = TypeVar("Length", int, Tensor)


def stage_length(lengths: Length) -> Length:
    """Frames (or mel bins) after one causal stride-2 stage: (L + 3 - 3) // 2 + 1."""
    return lengths // 2 + 1


def subsampled_length(length: int) -> int:
    """Frames (or mel bins) after the three stages: T // 8 + 1 for the time axis's windows."""
    return stage_length(stage_length(stage_length(length)))


class CausalSubsampling(nn.Module):
    """(B, n_mels, T) log-mel -> (B, T', d_model), T' = T // 8 + 1.

    `conv` indices follow NeMo's state dict: 0 conv, 2/5 depthwise, 3/6 pointwise (1/4/7 ReLU).
    Rows outside [start, length) are zeroed before every strided conv and at the end (NeMo's
    MaskedConvSequential masks the right end; the left `start` lets a stream's first chunk sit
    in a uniform-width window exactly as if the conv's own zero padding were there); after the
    first conv, with the ReLU before it, in one pass.
    """

    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        c = dims.subsampling_channels
        self.conv = nn.Sequential(
            nn.Conv2d(1, c, 3, stride=2), nn.ReLU(),
            nn.Conv2d(c, c, 3, stride=2, groups=c), nn.Conv2d(c, c, 1), nn.ReLU(),
            nn.Conv2d(c, c, 3, stride=2, groups=c), nn.Conv2d(c, c, 1), nn.ReLU(),
        )
        self.out = nn.Linear(c * subsampled_length(dims.features.n_mels), dims.d_model)

    def forward(self, mel: Tensor, lengths: Tensor, start: Tensor | None = None, full: bool = False,
                drop: int = 0) -> tuple[Tensor, Tensor]:
        """Args:
            mel: (B, n_mels, T); lengths: (B,) valid frames; start: (B,) first valid frame, a
            multiple of 8 (default 0); full: the caller knows every row is valid (no start,
            lengths == T), so the row masks, all ones, are skipped.
            drop: output frames the caller does not want, at the front (a streaming step's
            2 re-encoded cache frames): nothing that only they depend on is computed (`_first_needed`).
        Returns: (B, T' - drop, d_model) and (B,) output lengths counted from the first kept frame."""
        # a window too short to keep a frame: all of it, then nothing
        needed = _first_needed(drop) if subsampled_length(mel.shape[2]) > drop else [0, 0, 0, 0]
        x = mel.transpose(1, 2).unsqueeze(1)[:, :, needed[0]:]  # (B, 1, T, F) from the first needed frame
        if not full:
            x = x * _row_mask(x, lengths, start, needed[0])
        stage = 0
        for layer in self.conv:
            if isinstance(layer, nn.Conv2d) and layer.stride == (2, 2):  # 0, 2, 5
                lengths = stage_length(lengths)
                start = None if start is None else start // 2
                stage += 1
                x = _causal_strided_conv(layer, x, trimmed=needed[stage] > 0)
            elif isinstance(layer, nn.ReLU):  # each is followed by a strided conv or the end: the rows masked here
                x = torch.relu_(x) if full else _relu_rows(x, lengths, start, needed[stage])
            else:
                x = layer(x)
        x = x[:, :, drop - needed[3]:]
        b, c, t, f = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, c * f)), (lengths - drop).clamp(min=0)


def _first_needed(drop: int) -> list[int]:
    """The first frame each stage's input must have (mel, then the three convs' outputs) for
    outputs from frame `drop` on: output k of a causal stride-2 stage reads inputs 2k-2 .. 2k,
    so [2, 2, 2, 2] for a streaming step's drop of 2 and [0, 0, 0, 0] for none."""
    needed = [drop]
    for _ in range(3):
        needed.insert(0, max(0, 2 * needed[0] - 2))
    return needed


def _causal_strided_conv(conv: nn.Conv2d, x: Tensor, trimmed: bool = False) -> Tensor:
    """A 3x3 stride-2 conv with causal zero padding (2, 1) on both axes: (B, C, T, F) ->
    (B, C', T // 2 + 1, F // 2 + 1). `trimmed`: x starts at input frame 2k - 2 of the first
    wanted output k > 0, so time needs no left padding: (B, C', T // 2, F // 2 + 1), the same
    outputs from frame k on."""
    _, _, t, f = x.shape
    if not trimmed:
        y = F.conv2d(x, conv.weight, conv.bias, stride=conv.stride, padding=CAUSAL_LEFT_PAD, groups=conv.groups)
        return y[:, :, : t // 2 + 1, : f // 2 + 1]
    if t % 2 == 0:  # the last output reads the causal right padding (streaming windows are odd: never)
        x = F.pad(x, (0, 0, 0, 1))
    y = F.conv2d(x, conv.weight, conv.bias, stride=conv.stride, padding=(0, CAUSAL_LEFT_PAD), groups=conv.groups)
    return y[..., : f // 2 + 1]


def _relu_rows(x: Tensor, lengths: Tensor, start: Tensor | None, first: int) -> Tensor:
    """ReLU, then the invalid time rows zeroed, in one pass: clamp to [0, inf) on valid rows and
    to [0, 0] on the others (`_row_mask`'s rows)."""
    upper = torch.where(_row_mask(x, lengths, start, first) > 0, float("inf"), 0.0).to(x.dtype)
    return torch.clamp(x, x.new_zeros(()), upper)


def _row_mask(x: Tensor, lengths: Tensor, start: Tensor | None, first: int = 0) -> Tensor:
    """(B, 1, T, 1) mask of the valid time rows of a (B, C, T, F) activation whose row 0 is
    frame `first`."""
    t = torch.arange(first, first + x.shape[2], device=x.device)
    valid = t[None] < lengths[:, None]
    if start is not None:
        valid = valid & (t[None] >= start[:, None])
    return valid[:, None, :, None].to(x.dtype)
