"""WER of a streamd model through the daemon's own streaming pipeline, per voice and lookahead.

    python -m recipes.evaluate --model default-model.pt --device cuda \\
        --manifest reserved=/tmp/eval/manifest.jsonl --manifest train-voices=/tmp/evaltv/manifest.jsonl \\
        --out OUT [--contexts 13,6,1,0] [--batch 256] [--limit N]

Streaming: every utterance is a `Stream` of a `Recognizer` (as `streamd decode` does): the whole
file is pushed, the stream ended, and `rec.step` runs on all ready streams until none is ready,
`--batch` streams at a time on the device. Offline (for reference): features and the encoder
over the whole utterance under the same attention mask, then the same greedy search. Scoring:
lowercase, a-z and apostrophes only, WER = word edit distance / reference words.
Writes OUT/eval.md (tables) and OUT/eval.json.

`--nonspeech N` also streams N seeded non-speech clips of 2-10 s (`augment.nonspeech`: silence,
room noise, hum, tones, clicks, breaths, -75 to -15 dBFS) through the model alone (no speech
gate) and reports how many of them come out with any word, per kind.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recipes.data import Utterance, pad_float, read_float, read_manifest
from recipes.state import load_streamd_any
from recipes.wer import normalize, word_errors
from streamd.decoding.greedy import GreedyLabelLooping
from streamd.decode import stream_batch
from streamd.model.transducer import Transducer


def greedy(model: Transducer) -> GreedyLabelLooping:
    return GreedyLabelLooping(model.decoder, model.joint, model.dims.blank_id)


@torch.no_grad()
def offline_transcribe(model: Transducer, audios: Sequence[np.ndarray], batch: int = 64,
                       context: tuple[int, int] | None = None) -> list[list[int]]:
    """Token ids of each utterance, decoded offline in padded batches on the model's device, under
    attention context `context` (None: the model's default): `streamd.decode.transcribe_offline`,
    batched."""
    att_context = model.dims.att_context(context)
    search, device = greedy(model), model.device
    order = sorted(range(len(audios)), key=lambda i: len(audios[i]))
    out: list[list[int]] = [[] for _ in audios]
    for s in range(0, len(order), batch):
        idx = order[s: s + batch]
        wav, lengths = pad_float([audios[i] for i in idx])
        mel, mel_len = model.preprocessor(wav.to(device), lengths.to(device))
        enc, enc_len = model.encoder(mel, mel_len, att_context)
        hyps, _ = search(enc, enc_len)
        for i, (toks, _) in zip(idx, hyps.to_lists()):
            out[i] = toks
    return out


@torch.no_grad()
def stream_transcribe(model: Transducer, audios: Sequence[np.ndarray], right_context: int,
                      batch: int = 256) -> list[list[int]]:
    """Token ids of each utterance through the daemon's streaming pipeline, `batch` at once."""
    out: list[list[int]] = []
    for s in range(0, len(audios), batch):
        out += [toks for toks, _ in stream_batch(model, audios[s: s + batch],
                                                 model.dims.att_context_with_right(right_context))]
    return out


def score(utts: Sequence[Utterance], hyps: Sequence[str]) -> dict[str, Any]:
    """Corpus WER overall and per voice."""
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    errors = words = 0
    for u, h in zip(utts, hyps):
        e, n = word_errors(u.text, h)
        errors, words = errors + e, words + n
        per[u.voice][0] += e
        per[u.voice][1] += n
    return {"wer": 100.0 * errors / max(words, 1), "errors": errors, "words": words,
            "per_voice": {v: {"wer": 100.0 * e / max(n, 1), "errors": e, "words": n}
                          for v, (e, n) in sorted(per.items())}}


def evaluate_sets(model: Transducer, tokenizer: Any, sets: dict[str, list[Utterance]],
                  contexts: Sequence[int], batch: int, offline: bool = True,
                  log: Any = print) -> dict[str, Any]:
    """{set: {"R13": {"streaming": score, "offline": score}, ...}} plus a few example lines."""
    left = model.dims.att_context()[0]
    results: dict[str, Any] = {}
    for name, utts in sets.items():
        audios = [read_float(u.audio) for u in utts]
        res: dict[str, Any] = {"utterances": len(utts), "hours": sum(u.duration for u in utts) / 3600}
        for r in contexts:
            t0 = time.perf_counter()
            hyp = [tokenizer.decode(t) for t in stream_transcribe(model, audios, r, batch)]
            entry: dict[str, Any] = {"streaming": score(utts, hyp), "examples": [
                {"ref": u.text, "hyp": normalize(h), "voice": u.voice} for u, h in list(zip(utts, hyp))[:5]]}
            if offline:
                off = [tokenizer.decode(t) for t in offline_transcribe(model, audios, batch, (left, r))]
                entry["offline"] = score(utts, off)
            res[f"R{r}"] = entry
            log(f"{name} R={r}: streaming WER {entry['streaming']['wer']:.2f}"
                + (f", offline {entry['offline']['wer']:.2f}" if offline else "")
                + f" ({time.perf_counter() - t0:.1f} s)")
        results[name] = res
    return results


def nonspeech_clips(n: int, seed: int = 0) -> tuple[list[np.ndarray], list[str]]:
    """n non-speech clips of 2-10 s and their kinds (augment.nonspeech, seeded)."""
    from recipes.synthetic.augment import NONSPEECH_KINDS, _nonspeech_sounds

    g = torch.Generator().manual_seed(seed)
    lengths = (16000 * (2 + 8 * torch.rand(n, generator=g))).long()
    kinds_g = torch.Generator().manual_seed(seed)  # _nonspeech_sounds draws its kinds first
    kinds = torch.randint(0, len(NONSPEECH_KINDS), (n,), generator=kinds_g)
    sounds = _nonspeech_sounds(lengths, int(lengths.max()), torch.Generator().manual_seed(seed), 16000)
    return ([sounds[i, : int(lengths[i])].numpy() for i in range(n)],
            [NONSPEECH_KINDS[int(k)] for k in kinds])


def nonspeech_report(model: Transducer, tokenizer: Any, n: int, right_context: int, batch: int) -> dict[str, Any]:
    """How many of n non-speech clips give any word, streaming at `right_context`."""
    audios, kinds = nonspeech_clips(n)
    hyps = [tokenizer.decode(t) for t in stream_transcribe(model, audios, right_context, batch)]
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for kind, h in zip(kinds, hyps):
        per[kind][0] += bool(normalize(h))
        per[kind][1] += 1
    return {"clips": n, "with_words": sum(v[0] for v in per.values()), "right_context": right_context,
            "per_kind": {k: {"with_words": v[0], "clips": v[1]} for k, v in sorted(per.items())},
            "examples": [h for h in hyps if normalize(h)][:10]}


def pooled_wer(results: dict[str, Any], col: str, mode: str) -> float:
    """Corpus WER over all sets together (their errors over their words), e.g. the real-speech dev
    split from its per-source sets."""
    errors = sum(res[col][mode]["errors"] for res in results.values())
    return 100.0 * errors / max(sum(res[col][mode]["words"] for res in results.values()), 1)


def markdown(results: dict[str, Any], contexts: Sequence[int]) -> str:
    cols = [f"R{r}" for r in contexts]
    lines = ["## WER (%) by lookahead R (encoder frames of 80 ms)", "",
             "| set | mode | " + " | ".join(f"R={r} ({(r + 1) * 80} ms chunks)" for r in contexts) + " |",
             "|---|---|" + "---|" * len(cols)]
    for name, res in results.items():
        for mode in ("streaming", "offline"):
            if mode in res[cols[0]]:
                lines.append(f"| {name} ({res['utterances']} utts) | {mode} | "
                             + " | ".join(f"{res[c][mode]['wer']:.2f}" for c in cols) + " |")
    if len(results) > 1:
        utts = sum(res["utterances"] for res in results.values())
        for mode in ("streaming", "offline"):
            if all(mode in res[cols[0]] for res in results.values()):
                lines.append(f"| all {len(results)} sets pooled ({utts} utts) | {mode} | "
                             + " | ".join(f"{pooled_wer(results, c, mode):.2f}" for c in cols) + " |")
    for name, res in results.items():
        lines += ["", f"## {name}: streaming WER (%) per voice", "",
                  "| voice | words | " + " | ".join(f"R={r}" for r in contexts) + " |",
                  "|---|---|" + "---|" * len(cols)]
        for voice, v in res[cols[0]]["streaming"]["per_voice"].items():
            lines.append(f"| {voice} | {v['words']} | "
                         + " | ".join(f"{res[c]['streaming']['per_voice'][voice]['wer']:.1f}" for c in cols) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True, help="streamd checkpoint (whole file or NAME.000 parts)")
    ap.add_argument("--manifest", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--contexts", default="13,6,1,0", help="right contexts R to evaluate")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=256, help="concurrent streams / offline batch")
    ap.add_argument("--limit", type=int, help="first N utterances of each manifest")
    ap.add_argument("--no-offline", action="store_true")
    ap.add_argument("--nonspeech", type=int, default=0, help="also N non-speech clips: how many give words")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    loaded = load_streamd_any(args.model)
    model = loaded.model.to(args.device).eval()
    contexts = [int(c) for c in args.contexts.split(",")]
    sets = {}
    for spec in args.manifest:
        name, _, path = spec.partition("=")
        sets[name] = read_manifest(path, args.limit)
    print(f"model {loaded.name} on {args.device}; sets: " + ", ".join(f"{k} ({len(v)})" for k, v in sets.items()), flush=True)
    results = evaluate_sets(model, loaded.tokenizer, sets, contexts, args.batch, not args.no_offline,
                            log=lambda s: print(s, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    md = f"# {loaded.name}\n\n" + markdown(results, contexts)
    if args.nonspeech:
        ns = nonspeech_report(model, loaded.tokenizer, args.nonspeech, contexts[0], args.batch)
        results["nonspeech"] = ns
        md += (f"\n## Non-speech (no gate, R={ns['right_context']}): {ns['with_words']} of {ns['clips']} clips "
               "gave words\n\n| kind | clips with words |\n|---|---|\n"
               + "".join(f"| {k} | {v['with_words']} / {v['clips']} |\n" for k, v in ns["per_kind"].items()))
    (args.out / "eval.md").write_text(md)
    (args.out / "eval.json").write_text(json.dumps({"model": loaded.name, "results": results}, indent=1))
    print(md)
    return results


if __name__ == "__main__":
    main()
