"""Model presets, tokenizer training, and training-only extras (SpecAugment, dropout hooks).

Nothing here changes the served architecture: dropout is added by forward hooks that act only
in training mode and leave the state dict untouched.
"""
from __future__ import annotations

import copy
import dataclasses
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from streamd.model.tokenizer import Tokenizer
from streamd.model.dims import FeatureDims, ModelDims
from streamd.model.preprocessor import slaney_mel_filterbank
from streamd.model.transducer import Transducer

CONTEXTS = ((70, 13), (70, 6), (70, 1), (70, 0))
_COMMON: dict[str, Any] = {"conv_norm": "layer_norm", "att_context_sizes": CONTEXTS, "pred_rnn_layers": 1,
                           "ctc_head": True, "joint_dropout": True}
# default: 5.48 M parameters, 21.9 MB in fp32. The first-asked 176 x 10 layers is 9.02 M / 36.1 MB:
# over the 25 MB limit, and its training state would not fit the 64 MiB a GPU call carries.
PRESETS: dict[str, dict[str, Any]] = {
    "default": dict(d_model=144, n_layers=8, n_heads=4, ff_expansion=4, subsampling_channels=144,
                    conv_kernel=9, pred_hidden=320, joint_hidden=320, **_COMMON),
    "tiny": dict(d_model=32, n_layers=2, n_heads=2, ff_expansion=2, subsampling_channels=16,
                 conv_kernel=5, pred_hidden=32, joint_hidden=32, **_COMMON),
}
TOKENIZER_VOCAB = {"default": 256, "tiny": 64}
MAX_CHECKPOINT_BYTES = 25_000_000


def build_dims(size: str, vocab_size: int) -> ModelDims:
    return ModelDims(vocab_size=vocab_size, **PRESETS[size])


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def deepen(model: Transducer, n_layers: int) -> Transducer:
    """A deeper copy of `model` that computes the same function (up to LayerNorm's eps).

    Each new layer follows an old one, spread evenly (8 -> 12: after old layers 1, 3, 5, 7). The
    old layer's output norm loses its affine (its output is then exactly normalised) and the new
    layer, a copy of the old one, gets that affine and zeroed output projections (both
    feed-forwards, attention, convolution): its residual branches add nothing, and its output norm
    re-applies the affine to already normalised input. Training then grows the new layers out
    of zero, as a freshly added branch would. Everything outside the encoder's layers is copied.
    """
    old = model.dims.n_layers
    extra = n_layers - old
    if not 0 < extra <= old:
        raise ValueError(f"deepen: {old} -> {n_layers} layers: add between 1 and {old}")
    after = {round((j + 1) * old / extra) - 1 for j in range(extra)}
    layers: list[nn.Module] = []
    for i, layer in enumerate(model.encoder.layers):
        layer = copy.deepcopy(layer)
        layers.append(layer)
        if i in after:
            twin = copy.deepcopy(layer)
            with torch.no_grad():
                layer.norm_out.weight.fill_(1.0)
                layer.norm_out.bias.zero_()
                for out in (twin.feed_forward1.linear2, twin.feed_forward2.linear2,
                            twin.self_attn.linear_out, twin.conv.pointwise_conv2):
                    out.weight.zero_()
                    if out.bias is not None:
                        out.bias.zero_()
            layers.append(twin)
    deeper = Transducer(dataclasses.replace(model.dims, n_layers=n_layers))
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("encoder.layers.")}
    state.update({f"encoder.layers.{i}.{k}": v for i, layer in enumerate(layers)
                  for k, v in layer.state_dict().items()})
    deeper.load_state_dict(state)
    return deeper


def train_tokenizer(texts: Iterable[str], path: str | Path, vocab_size: int) -> Tokenizer:
    """SentencePiece BPE on the given (already normalised) sentences, saved to `path`."""
    import sentencepiece as spm

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spm-") as tmp:
        corpus = Path(tmp) / "text.txt"
        corpus.write_text("\n".join(sorted({t for t in texts if t})) + "\n")
        prefix = Path(tmp) / "tok"
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(prefix), vocab_size=vocab_size, model_type="bpe",
            character_coverage=1.0, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
            normalization_rule_name="identity", hard_vocab_limit=False, num_threads=4, minloglevel=2)
        data = prefix.with_suffix(".model").read_bytes()
    path.write_bytes(data)
    return Tokenizer(data)


def spec_augment(mel: Tensor, mel_len: Tensor, gen: torch.Generator, freq_masks: int = 2,
                 freq_width: int = 27, time_masks: int = 10, time_width: float = 0.05) -> Tensor:
    """NeMo's SpecAugment (streaming FastConformer config): masks filled with 0.0.

    mel (B, F, T); frequency masks of width 0..freq_width; time masks of width up to
    time_width x the utterance's length (at least 1 frame)."""
    b, f, t = mel.shape
    dev = mel.device

    def rand(n: int) -> Tensor:
        return torch.rand(b, n, generator=gen, device=dev)

    fw = (rand(freq_masks) * (freq_width + 1)).floor()
    f0 = (rand(freq_masks) * (f - fw + 1)).floor()
    fi = torch.arange(f, device=dev)[None, None]
    fmask = ((fi >= f0[..., None]) & (fi < (f0 + fw)[..., None])).any(1)
    length = mel_len.float()[:, None]
    tmax = (length * time_width).floor().clamp(min=1)
    tw = (rand(time_masks) * (tmax + 1)).floor()
    t0 = (rand(time_masks) * (length - tw + 1).clamp(min=1)).floor()
    ti = torch.arange(t, device=dev)[None, None]
    tmask = ((ti >= t0[..., None]) & (ti < (t0 + tw)[..., None])).any(1)
    return mel.masked_fill(fmask[:, :, None] | tmask[:, None, :], 0.0)


def vtlp(mel: Tensor, gen: torch.Generator, dims: FeatureDims, share: float = 0.5,
         alpha: tuple[float, float] = (0.9, 1.1), f_hi: float = 4800.0) -> Tensor:
    """Vocal tract length perturbation (Jaitly & Hinton 2013) on log-mel features: `share` of the
    rows get their spectral envelope stretched by a factor from `alpha` (formants move, tempo and
    pitch period do not: speed perturbation moves all three). Frequency f goes to alpha * f up to
    f_hi * min(alpha, 1) / alpha, then linearly to Nyquist, which stays put.

    mel (B, F, T) log-mel of `dims` (Slaney scale, 0 Hz to Nyquist); returns the same shape, each
    warped row read from its source frequencies by linear interpolation between mel bins."""
    b, f, _ = mel.shape
    dev = mel.device
    fb = slaney_mel_filterbank(dims)
    freqs = torch.linspace(0, dims.sample_rate / 2, fb.shape[1])
    centres = ((fb * freqs).sum(1) / fb.sum(1)).to(dev, torch.float64)  # (F,) each bin's centre in Hz, increasing
    nyq = dims.sample_rate / 2
    a = torch.rand(b, generator=gen, device=dev, dtype=torch.float64) * (alpha[1] - alpha[0]) + alpha[0]
    a = torch.where(torch.rand(b, generator=gen, device=dev) < share, a, torch.ones_like(a))[:, None]
    knee = f_hi * torch.clamp(a, max=1.0) / a  # (B, 1) Hz in the source's frequencies
    out_knee = a * knee
    # inverse warp: the source frequency each output bin's centre comes from
    fo = centres[None, :]
    src = torch.where(fo <= out_knee, fo / a, knee + (fo - out_knee) * (nyq - knee) / (nyq - out_knee))
    pos = _interp(src.clamp(centres[0], centres[-1]), centres, torch.arange(f, device=dev, dtype=torch.float64))
    lo = pos.floor().long().clamp(0, f - 1)
    hi = (lo + 1).clamp(max=f - 1)
    w = (pos - lo).to(mel.dtype)[:, :, None]
    t = mel.shape[2]
    return (mel.gather(1, lo[:, :, None].expand(b, f, t)) * (1 - w)
            + mel.gather(1, hi[:, :, None].expand(b, f, t)) * w)


def _interp(x: Tensor, xp: Tensor, fp: Tensor) -> Tensor:
    """np.interp for increasing `xp` (N,), any-shaped x within [xp[0], xp[-1]]."""
    i = torch.searchsorted(xp, x.contiguous()).clamp(1, xp.numel() - 1)
    x0, x1 = xp[i - 1], xp[i]
    return fp[i - 1] + (x - x0) / (x1 - x0) * (fp[i] - fp[i - 1])


def add_dropout(model: Transducer, p: float) -> list[Any]:
    """Dropout on the encoder's subsampling output, every residual branch (FF, attention, conv)
    and the prediction net's embeddings, as NeMo trains; active only in training mode."""
    if p <= 0:
        return []

    def hook(module: nn.Module, _inp: Any, out: Any) -> Any:
        if not module.training:
            return out
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, True), *out[1:])
        return F.dropout(out, p, True)

    targets: list[nn.Module] = [model.encoder.pre_encode, model.decoder.prediction.get_submodule("embed")]
    for layer in model.encoder.layers:
        targets += [layer.get_submodule(n) for n in ("feed_forward1", "self_attn", "conv", "feed_forward2")]
    return [m.register_forward_hook(hook) for m in targets]
