"""Loading .nemo files (plain and gzip tar), clear errors for what is unsupported, our format."""
from __future__ import annotations

import copy
import io
import tarfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from conftest import FIXTURES
from helpers import fixture_model, random_model, stream_through, synthetic_audio
from streamd.decode import transcribe_offline
from streamd.engine.recognizer import Recognizer
from streamd.model.checkpoint import (UnsupportedCheckpoint, dims_from_nemo_config, load_model,
                                      save_streamd)

NEMO = FIXTURES / "tiny_streaming_fastconformer_rnnt.nemo"


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}  # type: ignore[union-attr]


def write_tar(path: Path, files: dict[str, bytes], mode: str = "w:") -> Path:
    with tarfile.open(path, mode) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def config() -> dict[str, Any]:
    return yaml.safe_load(members(NEMO)["./model_config.yaml"])


def test_gzip_nemo_loads_like_plain(tmp_path: Path) -> None:
    gz = write_tar(tmp_path / "m.nemo", members(NEMO), "w:gz")
    a, b = load_model(gz).model.state_dict(), fixture_model("rnnt").model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_tokenizer_found_by_basename_when_config_holds_a_plain_path(tmp_path: Path) -> None:
    files = members(NEMO)
    cfg = config()
    tok = next(n for n in files if n.endswith("_tokenizer.model"))
    cfg["tokenizer"]["model_path"] = "/some/old/dir/" + tok.split("/")[-1]
    files["./model_config.yaml"] = yaml.safe_dump(cfg).encode()
    assert load_model(write_tar(tmp_path / "m.nemo", files)).tokenizer.vocab_size == 128


@pytest.mark.parametrize("change, message", [
    (lambda c: c["encoder"].update(causal_downsampling=False), "non-causal subsampling"),
    (lambda c: c["encoder"].update(att_context_style="regular"), "regular"),
    (lambda c: c["joint"].update(num_extra_outputs=5), "TDT"),
    (lambda c: c.update(target="nemo.collections.asr.models.ctc_bpe_models.EncDecCTCModelBPE"), "EncDecCTCModelBPE"),
    (lambda c: c["preprocessor"].update(normalize="per_feature"), "per_feature"),
    (lambda c: c["encoder"].update(self_attention_model="abs_pos"), "abs_pos"),
])
def test_unsupported_configs_name_the_problem(change: Any, message: str) -> None:
    cfg = copy.deepcopy(config())
    change(cfg)
    with pytest.raises(UnsupportedCheckpoint, match=message):
        dims_from_nemo_config(cfg)


def test_strict_keys_name_missing_and_unexpected(tmp_path: Path) -> None:
    files = members(NEMO)
    state = torch.load(io.BytesIO(files["./model_weights.ckpt"]), weights_only=True)
    state["joint.extra.weight"] = torch.zeros(1)
    del state["encoder.layers.0.self_attn.linear_pos.weight"]
    buf = io.BytesIO()
    torch.save(state, buf)
    files["./model_weights.ckpt"] = buf.getvalue()
    with pytest.raises(UnsupportedCheckpoint, match=r"missing \['encoder.layers.0.self_attn.linear_pos.weight'\].*joint.extra.weight"):
        load_model(write_tar(tmp_path / "m.nemo", files))


def test_not_a_checkpoint(tmp_path: Path) -> None:
    p = tmp_path / "x.pt"
    torch.save({"hello": 1}, p)
    with pytest.raises(UnsupportedCheckpoint, match="neither"):
        load_model(p)


def test_streamd_format_round_trip(tmp_path: Path) -> None:
    tok = fixture_model("rnnt").tokenizer
    m = random_model(1, vocab_size=tok.vocab_size)
    save_streamd(tmp_path / "m.pt", m, tok, "tiny")
    back = load_model(tmp_path / "m.pt")
    assert back.name == "tiny" and back.model.dims == m.dims
    assert all(torch.equal(a, b) for a, b in zip(back.model.state_dict().values(), m.state_dict().values()))
    assert back.tokenizer.decode([4, 17]) == tok.decode([4, 17])


def test_att_context_must_be_one_the_model_was_trained_for() -> None:
    m = fixture_model("rnnt").model
    with pytest.raises(ValueError, match="not in"):
        m.dims.att_context((70, 5))
    with pytest.raises(ValueError, match="right context 5 is not one this model was trained for; use 13, 6, 1 or 0"):
        m.dims.att_context_with_right(5)
    assert m.dims.att_context() == (70, 13) and m.dims.att_context_with_right(1) == (70, 1)


def nemotron_shaped(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The tiny fixture made into the shape of `nvidia/nemotron-speech-streaming-en-0.6b` (the
    third-party module dump in ../shared/design/nemo-reference.md, 1.4-1.5): 128 mels (a flatten
    of C x 17 frequency bins), `use_bias: false` (no bias on any layer's Linear or Conv; the
    pre-encoder keeps its own and LayerNorms theirs), a 2-layer LSTM prediction net; RNN-T only.
    NeMo's key set for it is made from the fixture's keys by those rules; the weights are a
    random model's of that configuration (`helpers.random_model`: it emits labels). Returns the
    file and the state dict written."""
    files, cfg = members(NEMO), config()
    cfg["encoder"].update(use_bias=False, feat_in=128)
    cfg["preprocessor"]["features"] = 128
    cfg["decoder"]["prednet"]["pred_rnn_layers"] = 2
    files["./model_config.yaml"] = yaml.safe_dump(cfg).encode()
    nemo_keys = set(torch.load(io.BytesIO(files["./model_weights.ckpt"]), weights_only=True))
    layer_biases = ("feed_forward1.linear1", "feed_forward1.linear2", "feed_forward2.linear1", "feed_forward2.linear2",
                    "conv.pointwise_conv1", "conv.depthwise_conv", "conv.pointwise_conv2",
                    "self_attn.linear_q", "self_attn.linear_k", "self_attn.linear_v", "self_attn.linear_out")
    nemo_keys = {k for k in nemo_keys
                 if not (k.startswith("encoder.layers.") and k.endswith(".bias") and k.split(".", 3)[3][:-5] in layer_biases)}
    nemo_keys |= {f"decoder.prediction.dec_rnn.lstm.{w}_l1" for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
    dims = dims_from_nemo_config(cfg)
    state = random_model(3, **{f.name: getattr(dims, f.name) for f in fields(dims)}).state_dict()
    assert set(state) == nemo_keys, sorted(set(state) ^ nemo_keys)
    c, d = cfg["encoder"]["subsampling_conv_channels"], cfg["encoder"]["d_model"]
    assert state["encoder.pre_encode.out.weight"].shape == (d, c * 17)
    buf = io.BytesIO()
    torch.save(state, buf)
    files["./model_weights.ckpt"] = buf.getvalue()
    return write_tar(tmp_path / "nemotron-shaped.nemo", files), state


def test_a_nemotron_shaped_checkpoint_loads_and_streams_like_offline(tmp_path: Path) -> None:
    """NeMo's key set for Nemotron-0.6B's configuration loads strictly (no key missing or left
    over, every shape as NeMo's), every tensor as written, and it streams as it decodes offline."""
    path, state = nemotron_shaped(tmp_path)
    loaded = load_model(path)
    m = loaded.model
    assert (m.dims.features.n_mels, m.dims.use_bias, m.dims.pred_rnn_layers) == (128, False, 2)
    got = m.state_dict()
    assert got.keys() == state.keys() and all(torch.equal(got[k], state[k].to(got[k].dtype)) for k in state)
    assert m.encoder.layers[0].self_attn.linear_q.bias is None and m.encoder.pre_encode.out.bias is not None
    rec = Recognizer(m, capacity=1)
    for k, seconds in enumerate((1.3, 3.4)):
        audio = synthetic_audio(seconds, k)
        stream = stream_through(rec, audio, np.random.default_rng(k))
        assert (stream.tokens, stream.times) == transcribe_offline(m, torch.from_numpy(audio))
        assert stream.tokens
