"""Put a trained model into the package as the default model, weights stored in fp16 or fp32.

    python -m recipes.ship MODEL.pt [--out streamd/assets/default-model.pt] [--name NAME] [--weights fp32]

With fp16 (the default; half the size), checks before writing: on a synthetic signal, the
fp16-stored weights must give the fp32 encoder output within 1 % and the same greedy tokens
(fp16 keeps 11 significant bits). fp32 stores exactly the evaluated weights.
"""
from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import torch

from streamd.decode import transcribe_offline
from streamd.model.checkpoint import DEFAULT_MODEL, load_model, save_streamd
from streamd.model.transducer import Transducer


@torch.no_grad()
def encoder_relative_error(a: Transducer, b: Transducer, audio: torch.Tensor) -> float:
    """|enc_a - enc_b| / |enc_a| for one signal (N,) through both models."""
    outs = []
    for m in (a, b):
        mel, mel_len = m.preprocessor(audio[None], torch.tensor([audio.numel()]))
        outs.append(m.encoder(mel, mel_len, m.dims.att_context())[0])
    return float((outs[0] - outs[1]).norm() / outs[0].norm())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--out", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--name", help="model name (default: the model's own)")
    ap.add_argument("--weights", choices=("fp16", "fp32"), default="fp16", help="stored weight precision")
    args = ap.parse_args(argv)
    dtype = torch.float16 if args.weights == "fp16" else torch.float32
    src = load_model(args.model)
    name = args.name or src.name
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_out = Path(tmp) / "model.pt"
        save_streamd(tmp_out, src.model, src.tokenizer, name, weights_dtype=dtype)
        shipped = load_model(tmp_out)
        t = torch.arange(16000 * 3) / 16000
        probe = 0.3 * torch.sin(2 * math.pi * 220 * t * (1 + t)) * (torch.sin(2 * math.pi * 3 * t) > 0)
        a = transcribe_offline(src.model.eval(), probe)
        b = transcribe_offline(shipped.model.eval(), probe)
        err = encoder_relative_error(src.model, shipped.model, probe)
        if err > 0.01:
            raise SystemExit(f"fp16 storage moved the encoder output by {err:.2%}")
        if a != b:
            raise SystemExit(f"fp16 storage changed the greedy output: {a} vs {b}")
        args.out.write_bytes(tmp_out.read_bytes())
    print(f"{args.out}: {args.out.stat().st_size / 1e6:.2f} MB, {name}")


if __name__ == "__main__":
    main()
