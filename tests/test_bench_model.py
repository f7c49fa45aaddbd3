"""`scripts/bench_model.py`: the benchmarks' random model decodes like a trained one, about
LABELS_PER_FRAME labels a frame spread over each stream and a few at a frame at most, on audio it
was not calibrated on too, where random weights emit max_symbols labels at most frames."""
from __future__ import annotations

import sys

import numpy as np
import torch

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import bench_model  # noqa: E402
import load  # noqa: E402
from streamd.decoding.greedy import DEFAULT_MAX_SYMBOLS, GreedyLabelLooping  # noqa: E402
from streamd.model.dims import ModelDims  # noqa: E402
from streamd.model.transducer import Transducer  # noqa: E402

SMALL = dict(d_model=64, n_layers=2, n_heads=2, subsampling_channels=32, pred_hidden=64, joint_hidden=64)


def labels_per_frame(m: Transducer, seeds: range, context: tuple[int, int]) -> np.ndarray:
    """Labels greedy decoding emits at each frame of fresh streams of tone bursts, (streams, T)."""
    pcm = [np.frombuffer(load.tone_bursts(seconds=bench_model.CLIP_S, seed=s).pcm, "<i2").astype(np.float32) / 32768
           for s in seeds]
    x = torch.from_numpy(np.stack(pcm))
    with torch.no_grad():
        enc, n = m.encoder(*m.preprocessor(x, torch.full((len(pcm),), x.shape[1])), context)
        hyps, _ = GreedyLabelLooping.for_model(m)(enc, n)
    return np.stack([np.bincount(hyps.times[i, :hyps.lengths[i]].numpy(), minlength=int(n[i])) for i in range(len(pcm))])


def test_the_benchmark_model_emits_a_trained_models_labels() -> None:
    torch.manual_seed(0)
    m = Transducer(ModelDims(vocab_size=255, **SMALL)).eval()
    before = labels_per_frame(m, range(100, 104), (70, 1))
    assert (before == DEFAULT_MAX_SYMBOLS).mean() > 0.05  # random weights: cascades of max_symbols
    rate = bench_model.calibrate(m)
    assert abs(rate - bench_model.LABELS_PER_FRAME) < 0.05
    for context in ((70, 13), (70, 1)):  # audio the calibration did not see
        after = labels_per_frame(m, range(100, 104), context)
        assert 0.1 < after.mean() < 0.6, (context, after.mean())
        assert after.max() <= bench_model.CLASSES // 2, context  # no cascade
        assert (after[:, bench_model.WARM_FRAMES:].sum(1) > 0).all(), context  # not only at stream starts
