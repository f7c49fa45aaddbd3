"""What CUDA graphs are valid for, shared by the encoder step and the graph decoder: the
placement (device, dtype) and the storage of every weight they read.

Both check a key before every call, so reading it must be cheap: walking `parameters()` costs
milliseconds on a FastConformer-L (a generator over every submodule), on the engine thread at
every step. The module tree is fixed for a model's life, so `Storages` finds once where each
parameter and buffer is held and reads only their data pointers at each call; a `.to()`, a cast
or replaced buffers show as new pointers, an in-place weight update keeps them (and the graphs
read the new values)."""
from __future__ import annotations

from typing import Protocol

import torch
from torch import nn


class Storages:
    """Data pointers of the parameters and buffers of `modules` (and their submodules)."""

    def __init__(self, *modules: nn.Module) -> None:
        self._slots: list[tuple[dict[str, torch.Tensor | None], str]] = []
        for root in modules:
            for m in root.modules():
                for table in (m._parameters, m._buffers):
                    self._slots.extend((table, name) for name, t in table.items() if t is not None)  # type: ignore[misc]

    def tensors(self) -> list[torch.Tensor]:
        return [t for table, name in self._slots if (t := table[name]) is not None]

    def pointers(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for t in self.tensors())


class PlacedKey(Protocol):
    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def weights(self) -> tuple[int, ...]: ...


def placement_changes(old: PlacedKey, new: PlacedKey) -> list[str]:
    """How `new` differs from `old` in device, dtype and weight storage (empty: it does not)."""
    why = []
    if old.device != new.device:
        why.append(f"device {old.device} -> {new.device}")
    if old.dtype != new.dtype:
        why.append(f"dtype {old.dtype} -> {new.dtype}")
    if old.weights != new.weights:
        why.append("weight storage replaced")
    return why
