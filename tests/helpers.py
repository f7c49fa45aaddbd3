"""Test helpers: fixture access and small random models."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import soundfile as sf
import torch

from conftest import FIXTURES
from streamd.decoding.greedy import GreedyLabelLooping
from streamd.engine.recognizer import Recognizer
from streamd.engine.stream import Stream
from streamd.model.checkpoint import LoadedModel, load_model
from streamd.model.dims import ModelDims
from streamd.model.transducer import Transducer

MODELS = ("rnnt", "hybrid")
CONTEXTS = {"att70_13": (70, 13), "att70_6": (70, 6), "att70_1": (70, 1), "att70_0": (70, 0)}


@lru_cache(maxsize=None)
def fixture_model(kind: str) -> LoadedModel:
    return load_model(FIXTURES / f"tiny_streaming_fastconformer_{kind}.nemo")


@lru_cache(maxsize=None)
def reference(kind: str) -> dict[str, Any]:
    """NeMo's recorded outputs for fixture model `kind`, trimmed to what the tests read
    (tests/fixtures/nemo-tiny/README.md)."""
    return complete_reference(torch.load(FIXTURES / "reference.pt", weights_only=True), kind)


def complete_reference(stored: dict[str, Any], kind: str) -> dict[str, Any]:
    """One model's reference from the stored file, with what it leaves out rebuilt exactly: each
    input's audio (its WAV) and the zero-padded batch of the inputs' mels."""
    inputs = {name: {**inp, "audio": torch.from_numpy(sf.read(FIXTURES / f"{name}.wav", dtype="float32")[0])}
              for name, inp in stored["inputs"].items()}
    ref = {**stored[kind], "inputs": inputs}
    batch = ref["batched"]["offline_default_ctx"]
    mels = [inputs[name]["mel"] for name in batch["names"]]
    width = max(m.shape[1] for m in mels)
    ref["batched"] = {**ref["batched"], "offline_default_ctx": {
        **batch, "mel": torch.stack([torch.nn.functional.pad(m, (0, width - m.shape[1])) for m in mels])}}
    return ref


def greedy(model: Transducer) -> GreedyLabelLooping:
    return GreedyLabelLooping(model.decoder, model.joint, model.dims.blank_id)


def tiny_dims(**kw: Any) -> ModelDims:
    base = dict(vocab_size=32, d_model=32, n_layers=2, n_heads=4, subsampling_channels=16,
                pred_hidden=32, joint_hidden=32)
    base.update(kw)
    return ModelDims(**base)


def random_model(seed: int = 0, **kw: Any) -> Transducer:
    """A random model whose greedy search emits a realistic mix of labels and blanks: the joint's
    logits are spread out and blank gets a bias so it wins on roughly half the lattice points."""
    torch.manual_seed(seed)
    m = Transducer(tiny_dims(**kw)).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.mul_(0).add_(1 + 0.2 * torch.randn_like(p))
        m.decoder.prediction.dec_rnn.lstm.weight_hh_l0.mul_(2.5)
        out = m.joint.joint_net[-1]
        out.weight.mul_(6.0)
        out.bias[m.dims.blank_id] += 1.5
    return m


def synthetic_audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    env = (np.sin(2 * np.pi * rng.uniform(1, 4) * t) > -0.3).astype(np.float32)
    f0 = rng.uniform(100, 300)
    x = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6)) / k for k in range(1, 6)) * env * 0.2
    return (x + rng.normal(0, 0.01, t.size)).astype(np.float32)


def run_streams(m: Transducer, decoder: Any, audios: list[np.ndarray], starts: list[int], seed: int = 0,
                events: dict[int, Any] | None = None, encoder: Any = None, features: str = "model",
                part_rows: int | None = None, recognizer: Recognizer | None = None
                ) -> tuple[list[tuple[list[int], list[int]]], list[str]]:
    """Streams join at `starts` ticks, push random-size pieces and leave when done; `events[tick]()`
    runs before that tick's step. `encoder`: the EncoderStep to use (default: eager); `features`:
    where frames are computed (the Recognizer's option). Returns each stream's (tokens, times) and
    the decoder modes seen. `part_rows`: the Recognizer's steps' part size (None: whole).
    `recognizer`: one made by the caller (the other settings are then its own)."""
    rng = np.random.default_rng(seed)
    rec = (recognizer if recognizer is not None else
           Recognizer(m, capacity=len(audios), search_factory=lambda _: decoder, features=features,
                      part_rows=part_rows)
           if encoder is None else
           Recognizer(m, capacity=len(audios), search_factory=lambda _: decoder, encoder_factory=lambda _: encoder,
                      features=features, part_rows=part_rows))
    streams: dict[int, Any] = {}
    pos, done, modes, tick = [0] * len(audios), [None] * len(audios), [], 0
    while any(x is None for x in done):
        if events and tick in events:
            events[tick]()
        for i, a in enumerate(audios):
            if tick < starts[i] or done[i] is not None:
                continue
            if i not in streams:
                streams[i] = rec.open()
            s = streams[i]
            if pos[i] < a.size:
                k = int(rng.integers(200, 3000))
                s.push_audio(a[pos[i]: pos[i] + k])
                pos[i] += k
            else:
                s.end()
        ready = [s for s in streams.values() if s.ready]
        if ready:
            rec.step(ready)
            modes.append(getattr(decoder, "mode", "eager"))
        for i, s in list(streams.items()):
            if s.finished:
                rec.close(s)
                done[i] = (s.tokens, s.times)
                del streams[i]
        tick += 1
    return done, modes


def stream_through(rec: Recognizer, audio: np.ndarray, rng: np.random.Generator, max_piece: int = 4000) -> Stream:
    """One stream of `audio` through `rec` alone, in random pieces of up to `max_piece` samples,
    stepped whenever it is ready, then ended and flushed; returns the finished stream."""
    s, i = rec.open(), 0
    while i < audio.size:
        k = int(rng.integers(1, max_piece))
        s.push_audio(audio[i: i + k])
        i += k
        while s.ready:
            rec.step([s])
    s.end()
    while s.ready:
        rec.step([s])
    rec.close(s)
    return s
