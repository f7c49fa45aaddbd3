"""The whole model: features, encoder, prediction net, joint, optional CTC head."""
from __future__ import annotations

import torch
from torch import nn

from streamd.model.preprocessor import LogMel
from streamd.model.dims import ModelDims
from streamd.model.encoder import ConformerEncoder
from streamd.model.rnnt import CTCHead, Joint, Predictor


class Transducer(nn.Module):
    """Submodule names follow NeMo's state dict (`preprocessor`, `encoder`, `decoder`, `joint`,
    `ctc_decoder`), so a `.nemo` file's weights load with strict key checking. Holds no
    per-stream state: caches and decoder state are passed in and out."""

    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.dims = dims
        self.preprocessor = LogMel(dims.features)
        self.encoder = ConformerEncoder(dims)
        self.decoder = Predictor(dims)
        self.joint = Joint(dims)
        self.ctc_decoder = CTCHead(dims) if dims.ctc_head else None

    @property
    def device(self) -> torch.device:
        return self.joint.enc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.joint.enc.weight.dtype
