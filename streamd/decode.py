"""`streamd decode`: run the model on audio files without a server (a user tool and the
reference that the daemon's results are checked against)."""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import torch

from streamd.engine.placement import move_model, parse_device, parse_dtype
from streamd.engine.recognizer import Recognizer, transcribe_offline
from streamd.engine.stream import Stream
from streamd.model.checkpoint import LoadedModel, load_model, resolve_model_path
from streamd.model.transducer import Transducer


@dataclass
class DecodeOptions:
    model: str | None = None
    att_context: tuple[int, int] | None = None
    streaming: bool = True
    device: str = "cpu"
    dtype: str = "fp32"
    batch: int = 16


def load_for_decoding(opts: DecodeOptions) -> LoadedModel:
    """The model `opts` names at its device and dtype; an untrained attention context fails here."""
    loaded = load_model(resolve_model_path(opts.model))
    loaded.model.dims.att_context(opts.att_context)
    move_model(loaded.model, parse_device(opts.device), parse_dtype(opts.dtype))
    return loaded


def decode_files(files: Sequence[str], opts: DecodeOptions, out: TextIO = sys.stdout) -> None:
    """Print one JSON line per file: file, text, tokens, timestamps (encoder frames)."""
    from streamd.audio.files import read_audio  # soundfile: only this command needs it

    loaded = load_for_decoding(opts)
    m, tok = loaded.model, loaded.tokenizer
    for i in range(0, len(files), opts.batch):
        group = files[i: i + opts.batch]
        audios = [read_audio(f, m.dims.features.sample_rate) for f in group]
        if opts.streaming:
            results = stream_batch(m, audios, opts.att_context)
        else:
            results = [transcribe_offline(m, torch.from_numpy(a), att_context=opts.att_context) for a in audios]
        for f, (tokens, times) in zip(group, results):
            out.write(json.dumps({"file": str(Path(f)), "text": tok.decode(tokens),
                                  "tokens": tokens, "timestamps": times}) + "\n")
            out.flush()


def stream_batch(model: Transducer, audios: Sequence[np.ndarray], att_context: tuple[int, int] | None = None
                 ) -> list[tuple[list[int], list[int]]]:
    """Tokens and times of each audio (float32 at the model rate) streamed through the daemon's
    pipeline at `att_context` (None: the model's default), all as concurrent streams batched
    together chunk by chunk."""
    rec = Recognizer(model, len(audios), att_context)
    streams: list[Stream] = []
    for a in audios:
        s = rec.open()
        s.push_audio(np.ascontiguousarray(a, dtype=np.float32))
        s.end()
        streams.append(s)
    while ready := [s for s in streams if s.ready]:
        rec.step(ready)
    for s in streams:
        rec.close(s)
    return [(s.tokens, s.times) for s in streams]
