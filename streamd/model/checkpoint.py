"""Load NeMo `.nemo` checkpoints (without nemo_toolkit) and read/write streamd's own format.

A `.nemo` file is a tar (plain or gzip) holding `model_config.yaml` (interpolations resolved),
`model_weights.ckpt` (the whole model's state dict) and tokenizer artifacts named
`<uuid>_<basename>`; config values point at them as `nemo:<uuid>_<basename>`.
"""
from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from streamd.model.tokenizer import Tokenizer
from streamd.model.dims import FeatureDims, ModelDims
from streamd.model.transducer import Transducer

SUPPORTED_CLASSES = ("EncDecRNNTBPEModel", "EncDecHybridRNNTCTCBPEModel")
STREAMD_FORMAT = "streamd-model/1"
IGNORED_KEYS = ("encoder.pos_enc.pe",)  # a non-persistent buffer some old checkpoints carry
DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "assets" / "default-model.pt"


class UnsupportedCheckpoint(ValueError):
    """The checkpoint is readable but is not a model streamd can run; the message says why."""


@dataclass
class LoadedModel:
    model: Transducer
    tokenizer: Tokenizer
    name: str


def resolve_model_path(path: str | os.PathLike[str] | None) -> Path:
    """The given path, or the model shipped in the package."""
    if path is not None:
        return Path(path)
    if not DEFAULT_MODEL.exists():
        raise FileNotFoundError(f"no model given and no default model shipped at {DEFAULT_MODEL}; pass --model")
    return DEFAULT_MODEL


def load_model(path: str | os.PathLike[str]) -> LoadedModel:
    """Load a `.nemo` file or a streamd checkpoint onto the CPU in fp32, in eval mode."""
    p = Path(path)
    if p.is_dir():
        raise UnsupportedCheckpoint(f"{p} is a directory; --model takes a .nemo file or a streamd checkpoint")
    if not p.exists():
        raise FileNotFoundError(f"no model file {p}")
    try:
        loaded = load_nemo(p) if tarfile.is_tarfile(p) else load_streamd(p)
    except (UnsupportedCheckpoint, FileNotFoundError, PermissionError):
        raise
    except Exception as e:  # unpickling, a damaged tar or YAML, a config without a key we read
        raise UnsupportedCheckpoint(f"{p}: not a model streamd can read (a .nemo file or a {STREAMD_FORMAT} "
                                    f"checkpoint): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                                    ) from None
    loaded.model.eval()
    return loaded


def load_nemo(path: Path) -> LoadedModel:
    members = _read_tar(path)
    if "model_config.yaml" not in members or "model_weights.ckpt" not in members:
        raise UnsupportedCheckpoint(f"{path}: not a .nemo file (needs model_config.yaml and model_weights.ckpt)")
    cfg = yaml.safe_load(members["model_config.yaml"])
    dims = dims_from_nemo_config(cfg)
    tok = Tokenizer(_tokenizer_member(cfg, members, path))
    if tok.vocab_size != dims.vocab_size:
        raise UnsupportedCheckpoint(f"{path}: tokenizer has {tok.vocab_size} pieces, decoder expects {dims.vocab_size}")
    state = _torch_load(members["model_weights.ckpt"])
    model = Transducer(dims)
    load_state_dict_strict(model, state, str(path))
    return LoadedModel(model, tok, path.stem)


def load_streamd(path: Path) -> LoadedModel:
    blob = _torch_load(path.read_bytes())
    if not isinstance(blob, dict) or blob.get("format") != STREAMD_FORMAT:
        raise UnsupportedCheckpoint(f"{path}: neither a .nemo tar nor a {STREAMD_FORMAT} checkpoint")
    model = Transducer(ModelDims.from_dict(blob["dims"]))
    load_state_dict_strict(model, blob["state_dict"], str(path))
    return LoadedModel(model, Tokenizer(bytes(blob["tokenizer"])), str(blob.get("name", path.stem)))


def save_streamd(path: str | os.PathLike[str], model: Transducer, tokenizer: Tokenizer, name: str,
                 weights_dtype: torch.dtype = torch.float32) -> None:
    """One file: dims, weights, tokenizer. Loadable with `torch.load(weights_only=True)`.

    `weights_dtype` is only how the weights are stored (fp16 halves the file); they load as fp32."""
    state = {k: v.detach().to(weights_dtype).cpu() if v.is_floating_point() else v.cpu()
             for k, v in model.state_dict().items()}
    torch.save({"format": STREAMD_FORMAT, "name": name, "dims": model.dims.to_dict(),
                "state_dict": state, "tokenizer": tokenizer.model_proto}, path)


def load_state_dict_strict(model: Transducer, state: dict[str, torch.Tensor], where: str) -> None:
    state = {k: v for k, v in state.items() if k not in IGNORED_KEYS}
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise UnsupportedCheckpoint(
            f"{where}: state dict does not match the architecture: missing {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
    model.load_state_dict(state, strict=True)


def dims_from_nemo_config(cfg: dict[str, Any]) -> ModelDims:
    """Validate a NeMo model config and translate it; raise `UnsupportedCheckpoint` naming what
    streamd cannot run."""
    cls = str(cfg.get("target", "")).rsplit(".", 1)[-1]
    if cls not in SUPPORTED_CLASSES:
        raise UnsupportedCheckpoint(f"model class {cls or '(none)'!r} is not supported; supported: {', '.join(SUPPORTED_CLASSES)}")
    enc, dec, joint, pre = cfg["encoder"], cfg["decoder"], cfg["joint"], cfg["preprocessor"]
    _require(str(enc.get("_target_", "")).endswith("ConformerEncoder"), f"encoder {enc.get('_target_')} (need a ConformerEncoder)")
    _require(enc.get("subsampling") == "dw_striding" and int(enc.get("subsampling_factor", 0)) == 8,
             f"subsampling {enc.get('subsampling')} x{enc.get('subsampling_factor')} (need dw_striding x8)")
    _require(bool(enc.get("causal_downsampling")), "non-causal subsampling (causal_downsampling: false); not a cache-aware streaming model")
    _require(enc.get("self_attention_model", "rel_pos") == "rel_pos", f"self_attention_model {enc.get('self_attention_model')} (need rel_pos)")
    _require(enc.get("att_context_style") == "chunked_limited", f"att_context_style {enc.get('att_context_style')!r} (need chunked_limited; 'regular' needs cache dropping)")
    conv_ctx = enc.get("conv_context_size")
    k = int(enc.get("conv_kernel_size", 9))
    _require(conv_ctx == "causal" or list(conv_ctx or []) == [k - 1, 0], f"conv_context_size {conv_ctx} (need causal)")
    _require(int(enc.get("feat_out", -1)) in (-1, int(enc["d_model"])), "encoder feat_out projection")
    _require(enc.get("untie_biases", True), "tied positional biases (untie_biases: false)")
    _require(enc.get("conv_norm_type", "batch_norm") in ("batch_norm", "layer_norm"), f"conv_norm_type {enc.get('conv_norm_type')}")
    loss_name = str((cfg.get("loss") or {}).get("loss_name", "default"))
    _require(int(joint.get("num_extra_outputs", 0) or 0) == 0 and loss_name != "tdt", "TDT (token-and-duration) models")
    _require(dec.get("blank_as_pad", True), "decoder without blank_as_pad")
    pn = dec["prednet"]
    _require(pn.get("rnn_hidden_size") in (None, -1, pn["pred_hidden"]), "prediction net with an LSTM projection (rnn_hidden_size)")
    norm = str(pre.get("normalize", "NA"))
    _require(norm in ("NA", "None", "none", ""), f"preprocessor normalize {norm!r} (per-utterance normalisation cannot stream)")
    _require(pre.get("window", "hann") == "hann" and int(pre.get("n_fft", 512)) == 512, "preprocessor window/n_fft other than hann/512")
    ctx = enc.get("att_context_size")
    ctxs = [ctx] if ctx and isinstance(ctx[0], int) else list(ctx or [[-1, -1]])
    for left, right in ctxs:
        _require(right >= 0 and left >= 0 and left % (right + 1) == 0, f"att_context_size {[left, right]}")
    nemo = FeatureDims()  # NeMo's defaults, for keys a config leaves out
    sr = int(pre.get("sample_rate", nemo.sample_rate))
    ch = int(enc.get("subsampling_conv_channels", -1))
    aux = (cfg.get("aux_ctc") or {}).get("decoder")
    jn = joint["jointnet"]
    return ModelDims(
        vocab_size=int(dec["vocab_size"]), d_model=int(enc["d_model"]), n_layers=int(enc["n_layers"]),
        n_heads=int(enc["n_heads"]), ff_expansion=int(enc.get("ff_expansion_factor", 4)),
        subsampling_channels=ch if ch > 0 else int(enc["d_model"]), conv_kernel=k,
        conv_norm=str(enc.get("conv_norm_type", "batch_norm")), use_bias=bool(enc.get("use_bias", True)),
        xscaling=bool(enc.get("xscaling", True)), pos_emb_max_len=int(enc.get("pos_emb_max_len", 5000)),
        att_context_sizes=tuple((int(a), int(b)) for a, b in ctxs),
        pred_hidden=int(pn["pred_hidden"]), pred_rnn_layers=int(pn.get("pred_rnn_layers", 1)),
        joint_hidden=int(jn["joint_hidden"]), joint_activation=str(jn.get("activation", "relu")),
        joint_dropout=float(jn.get("dropout", 0.0) or 0.0) > 0, ctc_head=aux is not None,
        features=FeatureDims(sample_rate=sr, n_mels=int(pre.get("features", nemo.n_mels)),
                             n_fft=int(pre.get("n_fft", nemo.n_fft)),
                             win_length=int(round(float(pre.get("window_size", nemo.win_length / nemo.sample_rate)) * sr)),
                             hop_length=int(round(float(pre.get("window_stride", nemo.hop_length / nemo.sample_rate)) * sr)),
                             preemph=float(pre.get("preemph", nemo.preemph))),
    )


def _require(ok: object, what: str) -> None:
    if not ok:
        raise UnsupportedCheckpoint(f"unsupported checkpoint: {what}")


def _read_tar(path: Path) -> dict[str, bytes]:
    """Members by basename (NeMo writes './name'); plain tar first, then gzip."""
    out: dict[str, bytes] = {}
    with tarfile.open(path, "r:*") as tar:
        for m in tar.getmembers():
            if m.isfile():
                f = tar.extractfile(m)
                if f is not None:
                    out[os.path.basename(m.name)] = f.read()
    return out


def _tokenizer_member(cfg: dict[str, Any], members: dict[str, bytes], path: Path) -> bytes:
    tok = cfg.get("tokenizer") or {}
    if tok.get("type") != "bpe":
        raise UnsupportedCheckpoint(f"{path}: tokenizer type {tok.get('type')!r} (need bpe / SentencePiece)")
    ref = str(tok.get("model_path", ""))
    name = os.path.basename(ref.removeprefix("nemo:"))
    if name in members:
        return members[name]
    candidates = [n for n in members if n.endswith("tokenizer.model")]
    if len(candidates) == 1:
        return members[candidates[0]]
    raise UnsupportedCheckpoint(f"{path}: tokenizer model {ref!r} not found in the archive")


def _torch_load(data: bytes) -> Any:
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception:  # older NeMo pickles may hold non-tensor objects; these files are trusted input
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
