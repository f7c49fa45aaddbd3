"""Live migration: move the serving model to another device and/or dtype while streams go on.

1. The target copy of the model is prepared on a worker thread while the engine keeps serving
   from the source (`placed_copy`).
   A probe chunk runs through the copy there, so a target that cannot run (no bf16 kernel,
   out of memory) fails before anything changes, and the device is warm.
   The slot-state buffers at the target are allocated then too (`stage_cache`).
2. At a step boundary (on the engine thread, via `Engine.call`) `cut_over` swaps the model in
   and copies every live stream's encoder caches and decoder state to the target. On any
   error everything is put back as it was.
3. The decoder rebuilds its own device state lazily on the first chunk after the move.
"""
from __future__ import annotations

import copy
import logging
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from streamd.engine.placement import DTYPE_NAMES, move_model
from streamd.engine.recognizer import Recognizer
from streamd.model.encoder import EncoderCache
from streamd.model.transducer import Transducer

log = logging.getLogger("streamd.engine")


class MigrationFailed(RuntimeError):
    """The move did not happen; the engine still serves from the source placement."""


@dataclass
class MigrationReport:
    ok: bool
    source: str
    target: str
    prepare_ms: float
    pause_ms: float  # engine paused: swap, state conversion, probe step
    streams: int
    error: str = ""
    at: float = 0.0
    moved: bool = True  # False: the model already was at the target, nothing was done

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def placement(model: Transducer) -> str:
    return f"{model.device} {DTYPE_NAMES[model.dtype]}"


def placed_copy(master: Transducer, device: torch.device, dtype: torch.dtype,
                probe: tuple[int, int] | None = None) -> Transducer:
    """A copy of the master weights (fp32, CPU, as loaded) at the target placement, made while
    the engine keeps serving; fp32 -> bf16 -> fp32 thus gives back the exact fp32 model.

    With `probe` (an attention context: the serving one), one silent chunk then runs through the
    copy (eager decoder, its own throwaway slot state): a target that cannot run (no kernel for
    the dtype, out of memory) fails here, and the device's context, libraries and kernels are
    warm before the engine pauses. Raises whatever the allocation or the probe raises."""
    target = copy.deepcopy(master)
    try:
        move_model(target, device, dtype)
        if probe is not None:
            _probe(Recognizer(target, capacity=1, att_context=probe))
            _synchronize(device)
    except BaseException:
        del target
        _empty_cache(device)
        raise
    return target


def stage_cache(target: Transducer, capacity: int, att_context: tuple[int, int]) -> EncoderCache:
    """Slot-state buffers at the target placement, allocated (pages touched) before the pause,
    so the cut-over only copies into them. For a FastConformer-L with 256 slots the encoder
    cache is about 0.7 GB in fp32: allocating it inside the pause dominated a move to the CPU."""
    return target.encoder.init_cache(capacity, att_context, target.device, target.dtype)


def cut_over(rec: Recognizer, target: Transducer, staged: EncoderCache | None = None) -> tuple[float, int]:
    """Swap a prepared `target` in at a step boundary; runs on the engine thread, so no step
    runs meanwhile and audio that arrives is queued. Converts every live stream's encoder
    caches (into `staged`, if given) and decoder carry. Returns (pause ms, live streams); on
    failure puts the source back and raises MigrationFailed."""
    t0 = time.perf_counter()
    source = rec.model
    try:
        rec.use_model(target, staged)
        rec.state_tensors()
        _synchronize(target.device)
    except Exception as e:
        rec.use_model(source)
        rec.state_tensors()
        _empty_cache(target.device)
        raise MigrationFailed(f"{type(e).__name__}: {e}") from e
    old_device = source.device
    del source
    _empty_cache(old_device)
    return (time.perf_counter() - t0) * 1000, rec.active


def _probe(rec: Recognizer) -> None:
    """One silent chunk through encoder and decoder."""
    s = rec.open()
    try:
        s.push_audio(np.zeros(rec.geometry.window * rec.geometry.hop, dtype=np.float32))
        s.end()
        while s.ready:
            rec.step([s])
    finally:
        rec.close(s)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
