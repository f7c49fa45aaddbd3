"""RNN-T prediction network, joint and the optional CTC head (NeMo key names).

Blank is the last label (id V); it embeds to the zero vector and doubles as the start symbol.
"""
from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from streamd.model.dims import ModelDims

PredictorState = tuple[Tensor, Tensor]  # (h, c), each (L, B, P)

_ACTIVATIONS = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}

# cuDNN runs bf16 LSTMs, but torch's `flatten_parameters` leaves bf16 weights as they are (bf16 is
# not in `torch.backends.cudnn.CUDNN_TENSOR_DTYPES`), so each bf16 call on a GPU compacts the
# weights first (one copy of the prediction net's LSTM: 6.6 MB for NeMo's 640-wide one, small
# beside a step) and warns, which is only noise in a daemon's log. fp16 and fp32 are flattened
# by `model.to`.
warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous chunk",
                        category=UserWarning)


class _DecRnn(nn.Module):
    def __init__(self, lstm: nn.LSTM) -> None:
        super().__init__()
        self.lstm = lstm


class _Prediction(nn.Module):
    """Holds the parameters under NeMo's names: prediction.embed, prediction.dec_rnn.lstm."""

    def __init__(self, embed: nn.Embedding, lstm: nn.LSTM) -> None:
        super().__init__()
        self.embed = embed
        self.dec_rnn = _DecRnn(lstm)


class Predictor(nn.Module):
    """Embedding(V+1, P, padding_idx=blank) -> LSTM(P, P, L): one label step per call."""

    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        p = dims.pred_hidden
        self.prediction = _Prediction(nn.Embedding(dims.vocab_size + 1, p, padding_idx=dims.blank_id),
                                      nn.LSTM(p, p, dims.pred_rnn_layers))

    def initial_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> PredictorState:
        lstm = self.prediction.dec_rnn.lstm
        shape = (lstm.num_layers, batch, lstm.hidden_size)
        return torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype)

    def forward(self, labels: Tensor, state: PredictorState) -> tuple[Tensor, PredictorState]:
        """labels: (B,) int64; state: (h, c) each (L, B, P). Returns (B, P) and the new state."""
        emb = self.prediction.embed(labels).unsqueeze(0)  # (1, B, P) time-major
        out: Tensor
        out, (h, c) = self.prediction.dec_rnn.lstm(emb, state)
        return out[0], (h, c)

    def teacher_forced(self, labels: Tensor) -> Tensor:
        """labels: (B, U). Returns (B, U+1, P): output after blank, then after each label."""
        b = labels.shape[0]
        pad = self.prediction.embed.padding_idx
        assert pad is not None
        blank = torch.full((b, 1), pad, dtype=labels.dtype, device=labels.device)
        emb = self.prediction.embed(torch.cat([blank, labels], 1)).transpose(0, 1)
        w = self.prediction.embed.weight
        out: Tensor
        out, _ = self.prediction.dec_rnn.lstm(emb, self.initial_state(b, w.device, w.dtype))
        return out.transpose(0, 1)


class Joint(nn.Module):
    """logits = joint_net(enc(f) + pred(g)), split so both projections can be cached."""

    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        j = dims.joint_hidden
        self.enc = nn.Linear(dims.d_model, j)
        self.pred = nn.Linear(dims.pred_hidden, j)
        layers: list[nn.Module] = [_ACTIVATIONS[dims.joint_activation]()]
        if dims.joint_dropout:
            layers.append(nn.Dropout(0.0))  # a no-op kept so the output layer is `joint_net.2`
        layers.append(nn.Linear(j, dims.vocab_size + 1))
        self.joint_net = nn.Sequential(*layers)

    def project_encoder(self, x: Tensor) -> Tensor:
        """(B, T, d) -> (B, T, J)."""
        return self.enc(x)

    def project_predictor(self, g: Tensor) -> Tensor:
        """(..., P) -> (..., J)."""
        return self.pred(g)

    def joint_after_projection(self, f: Tensor, g: Tensor) -> Tensor:
        """f, g: (..., J) broadcastable. Returns unnormalised logits (..., V+1)."""
        return self.joint_net(f + g)


class CTCHead(nn.Module):
    """Hybrid models' auxiliary CTC decoder: Conv1d(d, V+1, 1) then log_softmax."""

    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.decoder_layers = nn.Sequential(nn.Conv1d(dims.d_model, dims.vocab_size + 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, d) -> log-probs (B, T, V+1)."""
        return self.decoder_layers(x.transpose(1, 2)).transpose(1, 2).log_softmax(-1)
