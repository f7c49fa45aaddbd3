"""`streamd decode`: run the model on audio files without a server (a user tool and the
reference that the daemon's results are checked against): streamed through the daemon's pipeline
(`stream_batch`), or offline over the whole utterance (`transcribe_offline`)."""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
from torch import Tensor

from streamd.decoding.greedy import GreedyLabelLooping
from streamd.engine.placement import move_model, parse_device, parse_dtype
from streamd.engine.recognizer import Recognizer
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


def decode_files(files: Sequence[str], opts: DecodeOptions, out: TextIO | None = None,
                 err: TextIO | None = None) -> int:
    """Print one JSON line per file: file, text, tokens, timestamps (encoder frames); a file that
    cannot be read gets a line with its `error` (and one on `err`), the others are still decoded.
    Returns how many could not be read. `out`, `err`: stdout and stderr unless given."""
    out, err = out or sys.stdout, err or sys.stderr
    from streamd.audio.files import AudioFileError, read_audio  # soundfile: only this command needs it

    loaded = load_for_decoding(opts)
    m, tok = loaded.model, loaded.tokenizer
    failed = 0
    for i in range(0, len(files), opts.batch):
        group = files[i: i + opts.batch]
        audios: dict[str, np.ndarray] = {}
        errors: dict[str, str] = {}
        for f in group:
            try:
                audios[f] = read_audio(f, m.dims.features.sample_rate)
            except AudioFileError as e:
                errors[f] = str(e)
        if opts.streaming:
            results = stream_batch(m, list(audios.values()), opts.att_context) if audios else []
        else:
            results = [transcribe_offline(m, torch.from_numpy(a), att_context=opts.att_context) for a in audios.values()]
        decoded = dict(zip(audios, results))
        for f in group:  # in the order given
            if f in errors:
                failed += 1
                err.write(f"streamd decode: {errors[f]}\n")
                line: dict[str, object] = {"file": str(Path(f)), "error": errors[f]}
            else:
                tokens, times = decoded[f]
                line = {"file": str(Path(f)), "text": tok.decode(tokens), "tokens": tokens, "timestamps": times}
            out.write(json.dumps(line) + "\n")
            out.flush()
    return failed


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


def transcribe_offline(model: Transducer, audio: Tensor, decoder: GreedyLabelLooping | None = None,
                       att_context: tuple[int, int] | None = None) -> tuple[list[int], list[int]]:
    """Full-utterance reference: features, encoder under the streaming mask of `att_context`
    (None: the model's default), greedy search.
    audio: (N,) float32 at the model's rate. Returns tokens and their encoder-frame times."""
    context = model.dims.att_context(att_context)
    with torch.no_grad():
        device = model.device
        a = audio.to(device)[None]
        mel, mel_len = model.preprocessor(a, torch.tensor([a.shape[1]], device=device))
        enc, enc_len = model.encoder(mel, mel_len, context)
        hyps, _ = (decoder or GreedyLabelLooping.for_model(model))(enc, enc_len)
    return hyps.to_lists()[0]
