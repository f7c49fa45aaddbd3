"""The real-speech corpus (shared/data/real-speech) as carried sets for a GPU call.

    python -m recipes.real_speech --src ../shared/data/real-speech --out .carry/real [--train-level 0.97] \
        [--keep speech_commands=0.6]
    python -m recipes.synthetic.carried pack .carry/real/realdev .carry/real/train --out .carry/real.tar.xz --max-mib 40

Writes OUT/train (the `train` split, re-encoded as Ogg/Opus at libsndfile compression level
`--train-level`, smaller than the source so that it travels beside the repository) and
OUT/realdev (the `dev` split, the source files unchanged: what is evaluated is what users'
clips sound like), each with a manifest.jsonl in carried.py's shape (`audio` relative to the
set, `text`, `voice` = source:speaker, `source`, `duration`). The dev split never trains: it
picks checkpoints and is reported per source. `--keep SOURCE=SHARE` keeps that share of a
source's train clips (seeded: the same clips every time).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import shutil
from pathlib import Path
from typing import Any

import soundfile as sf


def _reencode(args: tuple[Path, Path, float]) -> bool:
    src, dst, level = args
    dst.parent.mkdir(parents=True, exist_ok=True)
    audio, rate = sf.read(src, dtype="float32")
    sf.write(dst, audio, rate, format="OGG", subtype="OPUS", compression_level=level)
    return True


def prepare(src: Path, out: Path, level: float, workers: int, keep: dict[str, float] | None = None
            ) -> dict[str, Any]:
    rows = [json.loads(line) for line in (src / "manifest.jsonl").read_text().splitlines() if line.strip()]
    sets: dict[str, list[dict[str, Any]]] = {"train": [], "realdev": []}
    jobs = []
    keep, rng = keep or {}, random.Random(0)
    for r in rows:
        name = "train" if r["split"] == "train" else "realdev"
        if name == "train" and r["source"] in keep and rng.random() >= keep[r["source"]]:
            continue
        sets[name].append({"audio": r["audio"], "text": r["text"], "voice": f"{r['source']}:{r['speaker']}",
                           "source": r["source"], "duration": r["duration"]})
        dst = out / name / r["audio"]
        if name == "train":
            jobs.append((src / r["audio"], dst, level))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / r["audio"], dst)
    with multiprocessing.Pool(workers) as pool:
        pool.map(_reencode, jobs, chunksize=32)
    report: dict[str, Any] = {}
    for name, set_rows in sets.items():
        (out / name / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in set_rows))
        size = sum((out / name / r["audio"]).stat().st_size for r in set_rows)
        report[name] = {"clips": len(set_rows), "hours": round(sum(r["duration"] for r in set_rows) / 3600, 3),
                        "mb": round(size / 1e6, 2)}
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--src", type=Path, required=True, help="the real-speech folder (manifest.jsonl)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--train-level", type=float, default=0.97, help="Opus compression level of train")
    ap.add_argument("--workers", type=int, default=multiprocessing.cpu_count())
    ap.add_argument("--keep", action="append", default=[], metavar="SOURCE=SHARE",
                    help="keep this share of a source's train clips (e.g. speech_commands=0.6)")
    args = ap.parse_args()
    keep = {k: float(v) for k, v in (item.split("=", 1) for item in args.keep)}
    print(json.dumps(prepare(args.src, args.out, args.train_level, args.workers, keep)))


if __name__ == "__main__":
    main()
