"""Decoder state carried across chunks: one row per stream slot, gathered and scattered by row."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


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

    def expand(self, batch: int) -> DecoderState:
        """Views of a one-row state repeated over `batch` rows (no copy)."""
        return DecoderState(self.h.expand(-1, batch, -1), self.c.expand(-1, batch, -1),
                            self.gproj.expand(batch, -1), self.label.expand(batch), self.frames.expand(batch))

    def to(self, device: torch.device, dtype: torch.dtype) -> DecoderState:
        """Float parts to dtype, everything to device."""
        return DecoderState(self.h.to(device, dtype), self.c.to(device, dtype), self.gproj.to(device, dtype),
                            self.label.to(device), self.frames.to(device))

    def clone(self) -> DecoderState:
        return DecoderState(self.h.clone(), self.c.clone(), self.gproj.clone(), self.label.clone(), self.frames.clone())
