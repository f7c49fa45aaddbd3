"""The GPU benchmarks' model: a FastConformer-L sized hybrid (114 M parameters, NeMo's
cache-aware streaming layout) with random weights and a SentencePiece tokenizer, whose joint and
prediction net are set so that greedy decoding emits labels the way a trained model does on speech.

Random weights alone decode badly for a benchmark: the joint follows the encoder, so a label that
wins at a frame wins again after it is emitted, and the decoder emits `max_symbols` (10) labels at
most frames; stream starts (the attention cache filling) stand out, and any blank bias lets them
take all the labels. A trained model emits one label at a frame, now and then two, about 0.1-0.4 a
frame (the repo's default model on 64 real-speech clips at 160 ms: 0.1 a frame, at most 3 at
one; the random weights: 2.4-4.2, 10 at most frames). Since the decoder's loop runs until the stream
with the most labels at a frame is done, that difference is 7-20x the decoder's iterations a step
and 20x the results.

How it is done (`calibrate`): the joint tells `CLASSES` acoustic classes apart (the principal
directions along which the encoder output varies inside streams of the benchmarks' own audio,
`load.tone_bursts`, each both ways), each active on a share of the frames, and emits class j's label
when class j is active unless the prediction net says that label came among the last `MEMORY`: its
LSTM adds a code of each label to its cell, each code decaying by `RECENT` a label. At most
CLASSES / 2 classes are active at a frame, so no frame emits more labels than that. The share is set
by bisection so that greedy decoding of fresh streams at every trained attention context emits
`LABELS_PER_FRAME`. Compute is that of any FastConformer-L: only values are set.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
import torch

import load  # scripts/load.py: the benchmarks' audio
from streamd.decoding.greedy import GreedyLabelLooping
from streamd.model.checkpoint import save_streamd
from streamd.model.dims import ModelDims
from streamd.model.tokenizer import Tokenizer
from streamd.model.transducer import Transducer

FASTCONFORMER_L: dict[str, Any] = dict(d_model=512, n_layers=17, n_heads=8, subsampling_channels=256,
                                       pred_hidden=640, joint_hidden=640, ctc_head=True)
LABELS_PER_FRAME = 0.3  # English speech in 1024 pieces: about 4 a second, 12.5 encoder frames a second
CLASSES = 16  # acoustic classes, one label each
RECENT = 0.85  # how much of a label's code the prediction net keeps after each later label
MEMORY = 8  # a label is held back while it is among the last MEMORY labels
WARM_FRAMES = 25  # a stream's first 2 s of encoder frames (the cache filling)
CLIPS, CLIP_S = 8, 8.0  # calibration audio: fresh streams of the benchmarks' tone bursts (seeds 0-7)


def make_model(path: Path, vocab: int, seed: int = 0) -> float:
    """The benchmark model (module docstring) with a `vocab`-piece tokenizer, saved to `path`.
    Returns the labels a frame its calibration streams decode to (`calibrate`)."""
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(2, 9))) for _ in range(4000)]
    lines = (" ".join(rng.choice(words, 12)) for _ in range(20000))
    proto = tempfile.NamedTemporaryFile(suffix=".model", delete=False).name[:-6]
    spm.SentencePieceTrainer.train(sentence_iterator=lines, model_prefix=proto, vocab_size=vocab,
                                   model_type="bpe", minloglevel=2)
    tok = Tokenizer(Path(proto + ".model").read_bytes())
    torch.manual_seed(seed)
    m = Transducer(ModelDims(vocab_size=tok.vocab_size, **FASTCONFORMER_L)).eval()
    rate = calibrate(m)
    save_streamd(path, m, tok, "fastconformer-l-random")
    return rate


def random_model_file(vocab: int = 1024) -> Path:
    """`make_model` into a new temporary folder: the benchmarks' default model file."""
    path = Path(tempfile.mkdtemp()) / "fastconformer-l-random.pt"
    make_model(path, vocab)
    return path


def calibration_frames(m: Transducer) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder output of CLIPS fresh streams of tone bursts at every trained attention context:
    (CLIPS x contexts, T, d) and the frame counts."""
    pcm = [np.frombuffer(load.tone_bursts(seconds=CLIP_S, seed=s).pcm, "<i2").astype(np.float32) / 32768
           for s in range(CLIPS)]
    x = torch.from_numpy(np.stack(pcm))
    feats = m.preprocessor(x, torch.full((CLIPS,), x.shape[1]))
    encoded = [m.encoder(*feats, context) for context in m.dims.att_context_sizes]
    return torch.cat([e for e, _ in encoded]), torch.cat([n for _, n in encoded])


@torch.no_grad()
def calibrate(m: Transducer) -> float:
    """Set the joint and the prediction net (module docstring). Returns the labels a frame that
    greedy decoding of the calibration streams emits."""
    enc, n = calibration_frames(m)
    labels = 1 + torch.arange(CLASSES) * ((m.dims.blank_id - 1) // CLASSES)  # over the vocabulary, past <unk> (0)
    codes = _remember_labels(m, labels)
    detect, floor = _recent_label_detector(m, labels, codes)
    scores, frames_mean = _class_directions(enc)  # (CLASSES, d)
    kappa, mu, lam = 4.0, 10.0, 50.0  # class scores' gain, the detectors' gain, a detection's weight
    je, jp, out = m.joint.enc, m.joint.pred, m.joint.joint_net[-1]
    assert isinstance(out, torch.nn.Linear)
    for layer in (je, jp, out):
        layer.weight.zero_()
        layer.bias.zero_()
    c = torch.arange(CLASSES)
    je.weight[:CLASSES] = kappa * scores
    jp.weight[CLASSES: 2 * CLASSES] = mu * detect
    jp.bias[CLASSES: 2 * CLASSES] = -mu * floor
    out.weight[labels, c] = 1.0
    out.weight[labels, CLASSES + c] = -lam
    out.bias.fill_(-30.0)  # labels of no class never win
    out.bias[labels] = 0.0
    out.bias[m.dims.blank_id] = 0.5  # a class's label wins when its score is above this
    search = GreedyLabelLooping.for_model(m)
    projected = enc.reshape(-1, enc.shape[-1]) @ scores.T - frames_mean @ scores.T  # (N, CLASSES)

    def rate(share: float) -> float:  # labels a frame when each class is active on `share` of the frames
        je.bias[:CLASSES] = -kappa * (torch.quantile(projected, 1 - share, dim=0) + frames_mean @ scores.T)
        hyps, _ = search(enc, n)
        return float(hyps.lengths.sum() / n.sum())

    lo, hi = 0.0, 0.5  # the rate rises with the share
    for _ in range(14):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) < LABELS_PER_FRAME else (lo, mid)
    return rate((lo + hi) / 2)


def _remember_labels(m: Transducer, labels: torch.Tensor) -> torch.Tensor:
    """Make the prediction net's LSTM add a code (CLASSES, P) of each label in `labels` to its
    cell, keeping RECENT of the cell at each label (no recurrent weights; input and output gates
    open): its output is tanh of the decaying sum of the last labels' codes. Returns the codes."""
    lstm, embed = m.decoder.get_submodule("prediction.dec_rnn.lstm"), m.decoder.get_submodule("prediction.embed")
    assert isinstance(lstm, torch.nn.LSTM) and isinstance(embed, torch.nn.Embedding) and lstm.num_layers == 1
    p, weights = lstm.hidden_size, dict(lstm.named_parameters())
    w, b = weights["weight_ih_l0"], weights["bias_ih_l0"]  # gates: input, forget, cell, output
    weights["weight_hh_l0"].zero_()
    weights["bias_hh_l0"].zero_()
    b.zero_()
    for gate, bias in ((0, 30.0), (1, float(np.log(RECENT / (1 - RECENT)))), (3, 30.0)):
        w[gate * p: (gate + 1) * p] = 0.0
        b[gate * p: (gate + 1) * p] = bias
    # orthogonal codes (no label's code leaks into another's detector) of entries about 0.12, where
    # tanh is near linear: a cell holding several still tells them apart
    codes = torch.linalg.qr(torch.randn(p, len(labels)))[0].T * 0.12 * p ** 0.5
    cell = w[2 * p: 3 * p]  # the embedding of label j makes the cell input tanh(cell @ embed_j) = codes[j]
    embed.weight[labels] = torch.linalg.lstsq(cell, torch.atanh(codes).T).solution.T
    return codes


def _recent_label_detector(m: Transducer, labels: torch.Tensor, codes: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Directions (CLASSES, P) and floor: detector j's response (direction j . net output) is above
    the floor while label j is among the last MEMORY labels, below it otherwise."""
    unit = codes / codes.norm(dim=1, keepdim=True)

    def response(j: int, after: list[int]) -> float:  # detector j after the labels `after`, from the start
        state = m.decoder.initial_state(1, torch.device("cpu"), torch.float32)
        out = torch.zeros(m.dims.pred_hidden)
        for k in after:
            g, state = m.decoder(labels[k: k + 1], state)
            out = g[0]
        return float(unit[j] @ out)

    k = len(labels)
    oldest = min(response(j, [(j + i) % k for i in range(MEMORY)]) for j in range(k))
    others = max(response(j, [(j + i) % k for i in range(1, 2 * MEMORY)]) for j in range(k))
    assert oldest > others, (oldest, others)
    return unit, torch.tensor((oldest + others) / 2)


def _class_directions(enc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CLASSES directions (CLASSES, d) of the encoder output: the CLASSES / 2 principal directions
    along which it varies inside streams once their caches are full (after WARM_FRAMES), each
    both ways (a class and its opposite are never active together), scaled so that a class's
    score has unit spread over the frames; and the frames' mean (d,). Directions of how the
    audio varies, not of one clip's frames: other audio of the kind emits at the same rate."""
    d = enc.shape[-1]
    late = enc[:, WARM_FRAMES:]
    within = (late - late.mean(1, keepdim=True)).reshape(-1, d)
    principal = torch.linalg.svd(within, full_matrices=False)[2][: CLASSES // 2]
    directions = torch.cat([principal, -principal])
    frames = enc.reshape(-1, d)
    mean = frames.mean(0)
    return directions / ((frames - mean) @ directions.T).std(0)[:, None], mean
