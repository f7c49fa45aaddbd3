"""Per-voice-group WER of two evaluations side by side (markdown), from `recipes.evaluate` JSON.

    python -m recipes.compare_evals OLD.json NEW.json [--set reserved-voices] [--context R13]

Groups: the engine and accent (`espeak-ng:en-us-nyc`, `flite:slt`, ...) with variants pooled,
so that a group has enough words to compare."""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def groups(result: dict[str, Any], context: str) -> dict[str, tuple[int, int]]:
    """(errors, words) per voice group of one set's streaming result at `context`."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for voice, r in result[context]["streaming"]["per_voice"].items():
        name = voice.split("+", 1)[0]
        out[name][0] += r["errors"]
        out[name][1] += r["words"]
    return {k: (e, w) for k, (e, w) in out.items()}


def table(old: dict[str, Any], new: dict[str, Any], set_name: str, context: str) -> str:
    a, b = groups(old["results"][set_name], context), groups(new["results"][set_name], context)
    rows = [f"| voice group | words | {old['model']} | {new['model']} |", "|---|---:|---:|---:|"]
    for name in sorted(set(a) | set(b)):
        ea, wa = a.get(name, (0, 0))
        eb, wb = b.get(name, (0, 0))
        fa = f"{100 * ea / wa:.1f}" if wa else "-"
        fb = f"{100 * eb / wb:.1f}" if wb else "-"
        rows.append(f"| {name} | {wb or wa} | {fa} | {fb} |")
    ta, tb = old["results"][set_name][context]["streaming"], new["results"][set_name][context]["streaming"]
    rows.append(f"| all | {tb['words']} | {ta['wer']:.1f} | {tb['wer']:.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--set", default="reserved-voices")
    ap.add_argument("--context", default="R13")
    args = ap.parse_args(argv)
    print(table(json.loads(args.old.read_text()), json.loads(args.new.read_text()), args.set, args.context))


if __name__ == "__main__":
    main()
