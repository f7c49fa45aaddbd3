"""`streamd decode`: run the model on audio files without a server (a user tool and the
reference that the daemon's results are checked against)."""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from streamd.audio.files import read_audio
from streamd.engine.placement import move_model, parse_device, parse_dtype
from streamd.engine.recognizer import Recognizer, transcribe_offline
from streamd.engine.stream import Stream
from streamd.model.checkpoint import LoadedModel, load_model, resolve_model_path


@dataclass
class DecodeOptions:
    model: str | None = None
    att_context: tuple[int, int] | None = None
    streaming: bool = True
    device: str = "cpu"
    dtype: str = "fp32"
    batch: int = 16


def prepare(opts: DecodeOptions) -> LoadedModel:
    loaded = load_model(resolve_model_path(opts.model))
    if opts.att_context is not None:
        loaded.model.encoder.set_att_context(opts.att_context)
    move_model(loaded.model, parse_device(opts.device), parse_dtype(opts.dtype))
    return loaded


def decode_files(files: Sequence[str], opts: DecodeOptions, out: TextIO = sys.stdout) -> None:
    """Print one JSON line per file: file, text, tokens, timestamps (encoder frames)."""
    loaded = prepare(opts)
    m, tok = loaded.model, loaded.tokenizer
    for i in range(0, len(files), opts.batch):
        group = files[i: i + opts.batch]
        audios = [read_audio(f, m.dims.features.sample_rate) for f in group]
        if opts.streaming:
            results = _stream_batch(Recognizer(m, len(group)), audios)
        else:
            results = [transcribe_offline(m, torch.from_numpy(a)) for a in audios]
        for f, (tokens, times) in zip(group, results):
            out.write(json.dumps({"file": str(Path(f)), "text": tok.decode(tokens),
                                  "tokens": tokens, "timestamps": times}) + "\n")
            out.flush()


def _stream_batch(rec: Recognizer, audios: list) -> list[tuple[list[int], list[int]]]:
    """All files as concurrent streams, batched together chunk by chunk."""
    streams: list[Stream] = []
    for a in audios:
        s = rec.open()
        s.push_audio(a)
        s.end()
        streams.append(s)
    while ready := [s for s in streams if s.ready]:
        rec.step(ready)
    for s in streams:
        rec.close(s)
    return [(s.tokens, s.times) for s in streams]
