"""Test helpers: fixture access and small random models."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from conftest import FIXTURES
from streamd.decoding.greedy import GreedyLabelLooping
from streamd.model.checkpoint import LoadedModel, load_model
from streamd.model.dims import ModelDims
from streamd.model.transducer import Transducer

MODELS = ("rnnt", "hybrid")
CONTEXTS = {"att70_13": (70, 13), "att70_6": (70, 6), "att70_1": (70, 1), "att70_0": (70, 0)}


@lru_cache(maxsize=None)
def fixture_model(kind: str) -> LoadedModel:
    return load_model(FIXTURES / f"tiny_streaming_fastconformer_{kind}.nemo")


@lru_cache(maxsize=None)
def reference(kind: str) -> dict[str, Any]:
    return torch.load(FIXTURES / f"reference_tiny_streaming_fastconformer_{kind}.pt", weights_only=True)


def greedy(model: Transducer) -> GreedyLabelLooping:
    return GreedyLabelLooping(model.decoder, model.joint, model.dims.blank_id)


def tiny_dims(**kw: Any) -> ModelDims:
    base = dict(vocab_size=32, d_model=32, n_layers=2, n_heads=4, subsampling_channels=16,
                pred_hidden=32, joint_hidden=32)
    base.update(kw)
    return ModelDims(**base)


def random_model(seed: int = 0, **kw: Any) -> Transducer:
    """A random model whose greedy search emits a realistic mix of labels and blanks: the joint's
    logits are spread out and blank gets a bias so it wins on roughly half the lattice points."""
    torch.manual_seed(seed)
    m = Transducer(tiny_dims(**kw)).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.mul_(0).add_(1 + 0.2 * torch.randn_like(p))
        m.decoder.prediction.dec_rnn.lstm.weight_hh_l0.mul_(2.5)
        out = m.joint.joint_net[-1]
        out.weight.mul_(6.0)
        out.bias[m.dims.blank_id] += 1.5
    return m
