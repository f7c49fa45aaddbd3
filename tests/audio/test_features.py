"""The log-mel front end: NeMo parity, our filterbank, and incremental == offline."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import reference
from streamd.audio.features import IncrementalLogMel, logmel_many
from streamd.model.preprocessor import LogMel, slaney_mel_filterbank
from streamd.model.dims import FeatureDims


def test_filterbank_and_window_match_nemo_buffers() -> None:
    meta = reference("rnnt")["meta"]["featurizer"]
    assert torch.allclose(slaney_mel_filterbank(FeatureDims())[None], meta["fb"], atol=1e-7)
    assert torch.equal(LogMel(FeatureDims()).featurizer.window, meta["window"])


def test_offline_features_match_nemo() -> None:
    """Bins near the 2^-24 floor carry FFT rounding (platform-dependent) into the log; relative
    to each frame's energy the linear-domain error stays at fp32 level."""
    lm = LogMel(FeatureDims())
    for name, inp in reference("rnnt")["inputs"].items():
        a = inp["audio"]
        mel, mel_len = lm(a[None], torch.tensor([a.numel()]))
        assert int(mel_len) == inp["mel_len"] == mel.shape[2]
        ref = inp["mel"][:, : inp["mel_len"]]
        diff = (mel[0] - ref).abs()
        assert float(diff.mean()) < 1e-5, name
        assert float(diff.max()) < 1e-3, name
        lin = (mel[0].exp() - ref.exp()).abs() / ref.exp().amax(0, keepdim=True)
        assert float(lin.max()) < 1e-5, name


def test_padded_batch_masks_like_nemo() -> None:
    lm = LogMel(FeatureDims())
    a, b = torch.randn(16000) * 0.1, torch.randn(9000) * 0.1
    batch = torch.stack([a, torch.nn.functional.pad(b, (0, 7000))])
    mel, mel_len = lm(batch, torch.tensor([16000, 9000]))
    alone, _ = lm(b[None], torch.tensor([9000]))
    assert mel_len.tolist() == [100, 56]
    assert torch.allclose(mel[1, :, :56], alone[0], atol=1e-5)
    assert torch.all(mel[1, :, 56:] == 0.0)


@pytest.mark.parametrize("max_piece", [1, 37, 160, 5000])
def test_incremental_equals_offline_bitwise(max_piece: int) -> None:
    lm = LogMel(FeatureDims())
    rng = np.random.default_rng(max_piece)
    for inp in list(reference("rnnt")["inputs"].values())[:2]:
        x = inp["audio"].numpy()[: 16000 if max_piece == 1 else None]
        offline, _ = lm(torch.from_numpy(x)[None], torch.tensor([x.size]))
        inc, parts, i = IncrementalLogMel(lm), [], 0
        while i < x.size:
            k = int(rng.integers(1, max_piece + 1))
            parts.append(inc.push(x[i: i + k]))
            i += k
        parts.append(inc.flush())
        assert torch.equal(torch.cat(parts, 1), offline[0])


def test_incremental_never_emits_past_the_offline_count() -> None:
    lm = LogMel(FeatureDims())
    inc = IncrementalLogMel(lm)
    total = 0
    for n in [100, 59, 1, 300, 1000]:
        total += inc.push(np.zeros(n, dtype=np.float32)).shape[1]
        assert total <= inc.samples_seen // 160
    total += inc.flush().shape[1]
    assert total == 1460 // 160


def test_many_streams_in_one_call_equal_each_alone_bitwise() -> None:
    lm = LogMel(FeatureDims())
    rng = np.random.default_rng(7)
    signals = [rng.standard_normal(n).astype(np.float32) * 0.1 for n in (700, 5000, 16000, 512, 3333)]
    alone = [lm(torch.from_numpy(x)[None], torch.tensor([x.size]))[0][0] for x in signals]
    extractors = [IncrementalLogMel(lm) for _ in signals]
    got: list[list[np.ndarray]] = [[] for _ in signals]
    pos = [0] * len(signals)
    while any(p < x.size for p, x in zip(pos, signals)) or pos[0] >= 0:
        final = all(p >= x.size for p, x in zip(pos, signals))
        segs, owners = [], []
        for i, (inc, x) in enumerate(zip(extractors, signals)):
            k = int(rng.integers(1, 2500))
            inc.feed(x[pos[i]: pos[i] + k])
            pos[i] += k
            seg = inc.take_segment(final=final)
            if seg is not None:
                segs.append(seg)
                owners.append(i)
        for i, frames in zip(owners, logmel_many(lm, segs)):
            got[i].append(frames)
        if final:
            break
    for parts, ref in zip(got, alone):
        assert np.array_equal(np.concatenate(parts, axis=1), ref.numpy())
