"""Average the weights of streamd model files trained from one another (a "model soup", Wortsman
et al. 2022): the shipped model and what a session fine-tuned from it, for example.

    python -m recipes.soup OUT.pt SHIPPED.pt NEW.pt [--weights 1,1] [--name NAME]

The models must have the same dims and tokenizer. The average is taken in fp32 and written in
fp32 (ship it with `recipes.ship`, which stores fp16 after checking the outputs). Averaging
only makes sense for models on one path of training (one started from the other, or both from a
third): two models trained apart have unrelated weights and their average recognises nothing.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from streamd.model.checkpoint import LoadedModel, load_model, save_streamd


def soup(models: Sequence[LoadedModel], weights: Sequence[float]) -> LoadedModel:
    """The weighted average of `models` (weights need not sum to 1); the first one's name and
    tokenizer. Raises ValueError for models of other dims or tokenizers."""
    if not models or len(models) != len(weights) or sum(weights) <= 0 or min(weights) < 0:
        raise ValueError("one non-negative weight per model, not all zero")
    first = models[0]
    for m in models[1:]:
        if m.model.dims != first.model.dims:
            raise ValueError(f"{m.name}: dims differ from {first.name}'s")
        if m.tokenizer.model_proto != first.tokenizer.model_proto:
            raise ValueError(f"{m.name}: tokenizer differs from {first.name}'s")
    total = float(sum(weights))
    states = [m.model.state_dict() for m in models]
    avg = {k: (sum(w * s[k].double() for w, s in zip(weights, states)) / total).to(v.dtype)
           if v.is_floating_point() else v for k, v in states[0].items()}
    first.model.load_state_dict(avg)
    return first


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("models", type=Path, nargs="+")
    ap.add_argument("--weights", help="comma-separated, one a model (default: equal)")
    ap.add_argument("--name", help="model name (default: the first model's + '-soup')")
    args = ap.parse_args(argv)
    weights = [float(w) for w in args.weights.split(",")] if args.weights else [1.0] * len(args.models)
    try:
        out = soup([load_model(p) for p in args.models], weights)
    except ValueError as e:
        raise SystemExit(f"recipes.soup: {e}") from None
    name = args.name or f"{out.name}-soup"
    save_streamd(args.out, out.model, out.tokenizer, name)
    print(f"{args.out}: {name}, the average of {len(args.models)} models (weights {weights})")


if __name__ == "__main__":
    main()
