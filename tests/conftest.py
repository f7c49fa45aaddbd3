"""Shared test fixtures: paths, seeded RNG, the `cuda` marker."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from streamd import buckets

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "nemo-tiny"  # see its README.md

if not torch.cuda.is_available():
    # Tests that turn the attention kernel on (`RelPositionMultiHeadAttention.kernel = True`) run
    # it in Triton's CPU interpreter; Triton reads this when the kernel's module is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def exact_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bucket padding only by the ratios, none by `PAD_ROWS`, and a migration's cover of
    every size called (`NEAR_PADDING` 1): tests of a few rows see each size as one at scale."""
    monkeypatch.setattr(buckets, "PAD_ROWS", 1)
    monkeypatch.setattr(buckets, "NEAR_PADDING", 1.0)
