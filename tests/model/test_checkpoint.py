"""Loading .nemo files (plain and gzip tar), clear errors for what is unsupported, our format."""
from __future__ import annotations

import copy
import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from conftest import FIXTURES
from helpers import fixture_model, random_model
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
