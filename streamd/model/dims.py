"""Architecture numbers of a cache-aware FastConformer RNN-T (no runtime settings here)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Mel frames a streaming step keeps from the previous step to give the subsampling its context.
PRE_ENCODE_CACHE = 9


@dataclass(frozen=True)
class FeatureDims:
    """Log-mel front end (NeMo `AudioToMelSpectrogramPreprocessor` with its inference defaults)."""

    sample_rate: int = 16000
    n_mels: int = 80
    n_fft: int = 512
    win_length: int = 400
    hop_length: int = 160
    preemph: float = 0.97


@dataclass(frozen=True)
class ModelDims:
    """Every architecture number of the model; two models with equal dims share weight shapes.

    `att_context_sizes` lists the [left, right] attention contexts (in encoder frames) the model
    was trained for; the first is the default, as in NeMo.
    """

    vocab_size: int  # V: tokenizer pieces; blank = V
    d_model: int = 512
    n_layers: int = 17
    n_heads: int = 8
    ff_expansion: int = 4
    subsampling_factor: int = 8
    subsampling_channels: int = 256
    conv_kernel: int = 9
    conv_norm: str = "layer_norm"  # or "batch_norm"
    use_bias: bool = True
    xscaling: bool = True
    pos_emb_max_len: int = 5000
    att_context_sizes: tuple[tuple[int, int], ...] = ((70, 13), (70, 6), (70, 1), (70, 0))
    pred_hidden: int = 640
    pred_rnn_layers: int = 1
    joint_hidden: int = 640
    joint_activation: str = "relu"
    joint_dropout: bool = True  # only decides the key index of the joint's output layer
    ctc_head: bool = False
    features: FeatureDims = field(default_factory=FeatureDims)

    @property
    def blank_id(self) -> int:
        return self.vocab_size

    def att_context(self, context: tuple[int, int] | None = None) -> tuple[int, int]:
        """`context` as a pair of ints, checked to be one of the [left, right] contexts the model
        was trained for (ValueError if not); None: the default, the first."""
        if context is None:
            return self.att_context_sizes[0]
        if tuple(context) not in self.att_context_sizes:
            raise ValueError(f"att_context_size {list(context)} not in {[list(c) for c in self.att_context_sizes]}")
        return int(context[0]), int(context[1])

    def att_context_with_right(self, right: int | None) -> tuple[int, int]:
        """The trained context with right context `right` and the default's left context (None:
        the default). ValueError if the model has no such context."""
        left, default_right = self.att_context_sizes[0]
        rights = [r for lf, r in self.att_context_sizes if lf == left]
        if right is not None and right not in rights:
            frame_ms = 1000 * self.subsampling_factor * self.features.hop_length / self.features.sample_rate
            ms = ", ".join(f"{r * frame_ms:g} ms" for r in rights)
            raise ValueError(f"right context {right} is not one this model was trained for; use "
                             f"{', '.join(map(str, rights[:-1]))} or {rights[-1]} (encoder frames of lookahead: {ms})"
                             if len(rights) > 1 else f"right context {right}: this model only has {rights[0]}")
        return self.att_context((left, default_right if right is None else right))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["att_context_sizes"] = [list(c) for c in self.att_context_sizes]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelDims:
        d = dict(d)
        d["att_context_sizes"] = tuple(tuple(c) for c in d["att_context_sizes"])
        d["features"] = FeatureDims(**d.get("features", {}))
        return cls(**d)
