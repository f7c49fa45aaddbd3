"""Decoder state carried across chunks: batched for a step, per-stream items in between."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class DecoderStateItem:
    """One stream's carry: h, c (L, P); gproj (J,) = joint.pred(prediction output); label ()
    last emitted label (blank before any); frames () encoder frames decoded so far."""

    h: Tensor
    c: Tensor
    gproj: Tensor
    label: Tensor
    frames: Tensor


@dataclass
class DecoderState:
    """Batched carry: h, c (L, B, P); gproj (B, J); label (B,) int64; frames (B,) int64.

    `gproj` is already projected by the joint, so continuing never re-runs the prediction net
    on the last label."""

    h: Tensor
    c: Tensor
    gproj: Tensor
    label: Tensor
    frames: Tensor

    @property
    def batch(self) -> int:
        return int(self.label.shape[0])

    def split(self) -> list[DecoderStateItem]:
        return [DecoderStateItem(self.h[:, i], self.c[:, i], self.gproj[i], self.label[i], self.frames[i])
                for i in range(self.batch)]

    @staticmethod
    def merge(items: Sequence[DecoderStateItem]) -> DecoderState:
        return DecoderState(torch.stack([i.h for i in items], 1), torch.stack([i.c for i in items], 1),
                            torch.stack([i.gproj for i in items]), torch.stack([i.label for i in items]),
                            torch.stack([i.frames for i in items]))

    def index_select(self, rows: Tensor) -> DecoderState:
        return DecoderState(self.h.index_select(1, rows), self.c.index_select(1, rows),
                            self.gproj.index_select(0, rows), self.label.index_select(0, rows),
                            self.frames.index_select(0, rows))

    def index_copy_(self, rows: Tensor, src: DecoderState) -> None:
        """Write src's rows into rows of self, in place."""
        self.h.index_copy_(1, rows, src.h)
        self.c.index_copy_(1, rows, src.c)
        self.gproj.index_copy_(0, rows, src.gproj)
        self.label.index_copy_(0, rows, src.label)
        self.frames.index_copy_(0, rows, src.frames)

    def where(self, mask: Tensor, other: DecoderState) -> DecoderState:
        """Rows of self where mask (B,) is True, else rows of other."""
        m1 = mask.view(1, -1, 1)
        return DecoderState(torch.where(m1, self.h, other.h), torch.where(m1, self.c, other.c),
                            torch.where(mask[:, None], self.gproj, other.gproj),
                            torch.where(mask, self.label, other.label), torch.where(mask, self.frames, other.frames))

    def to(self, device: torch.device, dtype: torch.dtype) -> DecoderState:
        """Float parts to dtype, everything to device."""
        return DecoderState(self.h.to(device, dtype), self.c.to(device, dtype), self.gproj.to(device, dtype),
                            self.label.to(device), self.frames.to(device))

    def clone(self) -> DecoderState:
        return DecoderState(self.h.clone(), self.c.clone(), self.gproj.clone(), self.label.clone(), self.frames.clone())
