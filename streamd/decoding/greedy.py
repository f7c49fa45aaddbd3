"""Batched greedy RNN-T decoding by label looping (Bataev et al. 2024), reference eager path.

The outer loop finds one label per utterance per iteration; the inner loop skips blanks by
re-evaluating only the joint at later frames. The prediction net runs once per emitted label for
the whole batch. Steps are in-place updates of a `LoopState`, with no host sync inside a step,
so `graphs.py` can capture exactly these steps; here Python drives the loops with `.any()`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from streamd.decoding.state import DecoderState
from streamd.model.rnnt import Joint, Predictor
from streamd.model.transducer import Transducer

DEFAULT_MAX_SYMBOLS = 10


@dataclass
class BatchedHyps:
    """Labels found in one call: labels, times (B, capacity) int64, the latter in global encoder
    frames; lengths (B,) valid entries per row."""

    labels: Tensor
    times: Tensor
    lengths: Tensor

    def to_lists(self) -> list[tuple[list[int], list[int]]]:
        n = self.lengths.tolist()
        width = max(n, default=0)  # only the columns some row uses become Python ints
        if not width:  # (torch turns a (b, 0) tensor into lists a thousand times slower than this)
            return [([], []) for _ in n]
        labels, times = self.labels[:, :width].tolist(), self.times[:, :width].tolist()
        return [(labels[b][: n[b]], times[b][: n[b]]) for b in range(len(n))]


@dataclass
class LoopState:
    """Everything one decode call touches; preallocated for (batch, frames) so that graph
    replays can reuse it. Float tensors are in the joint's dtype."""

    fproj: Tensor  # (B, T, J) projected encoder output
    lengths: Tensor  # (B,) valid frames
    state: DecoderState  # carry being updated
    time: Tensor  # (B,) current frame
    safe_time: Tensor  # (B,) min(time, last frame)
    last_t: Tensor  # (B,) last valid frame (0 if none)
    time_of_label: Tensor  # (B,) frame of the label being looked at
    label: Tensor  # (B,) candidate label
    active: Tensor  # (B,) bool: time < length
    advance: Tensor  # (B,) bool: active and candidate is blank
    active_any: Tensor  # () bool
    advance_any: Tensor  # () bool
    out_labels: Tensor  # (B, T * max_symbols + 1)
    out_times: Tensor  # (B, T * max_symbols + 1)
    out_len: Tensor  # (B,)
    last_stored_time: Tensor  # (B,) frame of the last stored label (-1 none)
    symbols_at_time: Tensor  # (B,) labels stored at last_stored_time
    batch_idx: Tensor  # (B,) arange


class GreedyLabelLooping:
    """Greedy RNN-T search over a batch, continuing from carried `DecoderState`.

    Holds no tensors between calls: the prediction net and joint are read at call time, so the
    reference path is correct on any device and dtype the model is moved to.
    """

    def __init__(self, predictor: Predictor, joint: Joint, blank_id: int,
                 max_symbols: int = DEFAULT_MAX_SYMBOLS) -> None:
        self.predictor, self.joint = predictor, joint
        self.blank_id, self.max_symbols = blank_id, max_symbols

    @classmethod
    def for_model(cls, model: Transducer) -> GreedyLabelLooping:
        return cls(model.decoder, model.joint, model.dims.blank_id)

    def initial_state(self, batch: int) -> DecoderState:
        """The after-start state: prediction net fed blank from zeros, projected by the joint."""
        w = self.joint.pred.weight
        blank = torch.full((batch,), self.blank_id, dtype=torch.long, device=w.device)
        with torch.no_grad():
            g, (h, c) = self.predictor(blank, self.predictor.initial_state(batch, w.device, w.dtype))
            gproj = self.joint.project_predictor(g)
        zeros = torch.zeros(batch, dtype=torch.long, device=w.device)
        return DecoderState(h, c, gproj, blank, zeros)

    @torch.no_grad()
    def __call__(self, enc: Tensor, lengths: Tensor, state: DecoderState | None = None
                 ) -> tuple[BatchedHyps, DecoderState]:
        """Args: enc (B, T, d) encoder output; lengths (B,); state: carry from the previous chunk
        (None = start of stream). Returns this chunk's labels (global times) and the new carry."""
        loop = self.new_loop(enc.shape[0], enc.shape[1], enc.device)
        self.load(loop, enc, lengths, state if state is not None else self.initial_state(enc.shape[0]))
        self.before_outer_loop(loop)
        while bool(loop.active_any):
            self.before_inner_loop(loop)
            while bool(loop.advance_any):
                self.inner_loop_step(loop)
            self.after_inner_loop(loop)
        return self.results(loop)

    # -- steps (shared with the CUDA-graph path) ---------------------------------------------
    def new_loop(self, batch: int, frames: int, device: torch.device) -> LoopState:
        w = self.joint.pred.weight
        dt = w.dtype
        cap = frames * self.max_symbols + 1
        init = self.initial_state(batch)

        def lng(*shape: int) -> Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        def boo(*shape: int) -> Tensor:
            return torch.zeros(shape, dtype=torch.bool, device=device)

        return LoopState(
            fproj=torch.zeros(batch, frames, w.shape[0], dtype=dt, device=device),
            lengths=lng(batch), state=init.clone(),
            time=lng(batch), safe_time=lng(batch), last_t=lng(batch),
            time_of_label=lng(batch), label=lng(batch),
            active=boo(batch), advance=boo(batch),
            active_any=boo(), advance_any=boo(),
            out_labels=lng(batch, cap), out_times=lng(batch, cap),
            out_len=lng(batch), last_stored_time=lng(batch),
            symbols_at_time=lng(batch), batch_idx=torch.arange(batch, dtype=torch.long, device=device))

    def load(self, loop: LoopState, enc: Tensor, lengths: Tensor, state: DecoderState) -> None:
        """Copy inputs into the loop's buffers (rows past `enc`'s batch get length 0)."""
        b, t = enc.shape[0], enc.shape[1]
        loop.fproj.zero_()
        loop.fproj[:b, :t].copy_(self.joint.project_encoder(enc.to(loop.fproj.dtype)))
        loop.lengths.zero_()
        loop.lengths[:b].copy_(lengths)
        s = loop.state
        s.h[:, :b].copy_(state.h)
        s.c[:, :b].copy_(state.c)
        s.gproj[:b].copy_(state.gproj)
        s.label[:b].copy_(state.label)
        s.frames[:b].copy_(state.frames)

    def before_outer_loop(self, loop: LoopState) -> None:
        loop.time.zero_()
        loop.out_len.zero_()
        loop.last_stored_time.fill_(-1)
        loop.symbols_at_time.zero_()
        torch.clamp(loop.lengths - 1, min=0, out=loop.last_t)
        torch.minimum(loop.time, loop.last_t, out=loop.safe_time)
        torch.lt(loop.time, loop.lengths, out=loop.active)
        torch.any(loop.active, out=loop.active_any)

    def before_inner_loop(self, loop: LoopState) -> None:
        """First candidate label at the current frame of every row."""
        loop.label.copy_(self._argmax_joint(loop))
        loop.time_of_label.copy_(loop.time)
        self._advance_blanks(loop)

    def inner_loop_step(self, loop: LoopState) -> None:
        """Rows whose candidate was blank look at their next frame with the same gproj."""
        torch.where(loop.advance, loop.time, loop.time_of_label, out=loop.time_of_label)
        torch.where(loop.advance, self._argmax_joint(loop), loop.label, out=loop.label)
        self._advance_blanks(loop)

    def after_inner_loop(self, loop: LoopState) -> None:
        """Store the found labels, step the prediction net for them, enforce max_symbols."""
        act = loop.active
        pos = loop.out_len.unsqueeze(1)
        loop.out_labels.scatter_(1, pos, torch.where(act, loop.label, loop.out_labels.gather(1, pos).squeeze(1)).unsqueeze(1))
        loop.out_times.scatter_(1, pos, torch.where(act, loop.time_of_label, loop.out_times.gather(1, pos).squeeze(1)).unsqueeze(1))
        loop.out_len.add_(act.long())
        same = act & (loop.last_stored_time == loop.time_of_label)
        torch.where(same, loop.symbols_at_time + 1, torch.where(act, torch.ones_like(loop.symbols_at_time), loop.symbols_at_time), out=loop.symbols_at_time)
        torch.where(act, loop.time_of_label, loop.last_stored_time, out=loop.last_stored_time)

        s = loop.state
        g, (h, c) = self.predictor(loop.label, (s.h, s.c))
        gproj = self.joint.project_predictor(g)
        m = act.view(1, -1, 1)
        torch.where(m, h, s.h, out=s.h)
        torch.where(m, c, s.c, out=s.c)
        torch.where(act.unsqueeze(1), gproj, s.gproj, out=s.gproj)
        torch.where(act, loop.label, s.label, out=s.label)

        force = act & (loop.symbols_at_time >= self.max_symbols)
        loop.time.add_(force.long())
        torch.minimum(loop.time, loop.last_t, out=loop.safe_time)
        torch.lt(loop.time, loop.lengths, out=loop.active)
        torch.any(loop.active, out=loop.active_any)

    def results(self, loop: LoopState, batch: int | None = None, frames: int | None = None
                ) -> tuple[BatchedHyps, DecoderState]:
        """Copies (never views) of the first `batch` rows, with times made global; with `frames`
        (the call's encoder frames, at most the loop's) the label columns are cut to what a loop
        of that many frames has."""
        b = loop.lengths.shape[0] if batch is None else batch
        w = loop.out_labels.shape[1] if frames is None else frames * self.max_symbols + 1
        offset = loop.state.frames[:b, None]
        hyps = BatchedHyps(loop.out_labels[:b, :w].clone(), loop.out_times[:b, :w] + offset, loop.out_len[:b].clone())
        s = loop.state
        new = DecoderState(s.h[:, :b].clone(), s.c[:, :b].clone(), s.gproj[:b].clone(), s.label[:b].clone(),
                           s.frames[:b] + loop.lengths[:b])
        return hyps, new

    # -- helpers -----------------------------------------------------------------------------
    def _argmax_joint(self, loop: LoopState) -> Tensor:
        f = loop.fproj[loop.batch_idx, loop.safe_time]  # (B, J)
        return self.joint.joint_after_projection(f, loop.state.gproj).argmax(-1)

    def _advance_blanks(self, loop: LoopState) -> None:
        blank = loop.label == self.blank_id
        loop.time.add_(blank.long())
        torch.minimum(loop.time, loop.last_t, out=loop.safe_time)
        torch.lt(loop.time, loop.lengths, out=loop.active)
        torch.logical_and(loop.active, blank, out=loop.advance)
        torch.any(loop.advance, out=loop.advance_any)
