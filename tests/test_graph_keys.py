"""Graph keys: the cached storage walk sees what `parameters()` and `buffers()` see, and every
placement change, at a fraction of the cost."""
from __future__ import annotations

import torch

from helpers import random_model
from streamd.graph_keys import Storages


def walk(m: torch.nn.Module) -> list[int]:
    return sorted(t.data_ptr() for t in (*m.parameters(), *m.buffers()))


def test_storages_follow_casts_and_keep_in_place_updates() -> None:
    m = random_model()
    s = Storages(m.encoder, m.decoder)
    before = s.pointers()
    assert sorted(before) == sorted(walk(m.encoder) + walk(m.decoder))
    with torch.no_grad():
        next(m.encoder.parameters()).add_(1.0)  # in place: same storage, graphs read the new values
    assert s.pointers() == before
    m.to(torch.bfloat16)
    after = s.pointers()
    assert after != before and sorted(after) == sorted(walk(m.encoder) + walk(m.decoder))
    m.to(torch.float32)
    assert s.pointers() != after
