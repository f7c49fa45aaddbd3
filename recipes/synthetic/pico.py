"""SVOX Pico speech (en-US and en-GB, both women) in synth.py's format: 16 kHz mono 16-bit WAV
and manifest.jsonl, with varied rate and pitch. Made wherever the engine is: the GPU machine gets
it as a small carried folder (`pack-lib`: PyPI `ttspico`'s `ctts` extension, built here per
CPython version, and the English language files).

    python -m recipes.synthetic.pico pack-lib --wheels DIR --out .carry/pico.tar.xz
    python -m recipes.synthetic.pico make --lib .carry/pico --text train.txt --n 8000 --out OUT \\
        [--workers 16] [--seed 20]
"""
from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .synth import PEAK, SAMPLE_RATE, Job, plan, write_wav
from .voices import PICO_VOICES, Voice, is_reserved

LANG_FILES = ("en-US_ta.bin", "en-US_lh0_sg.bin", "en-GB_ta.bin", "en-GB_kh0_sg.bin")
PITCH_RANGE = 0.2  # pitch -1..1 -> Pico pitch 80..120 % (rate: speed 0.8..1.2 -> 80..120 %)
CHUNK = 100

_engines: dict[str, Any] = {}


def pico_voices() -> list[Voice]:
    """Pico's two English voices (neither is reserved)."""
    return [v for v in (Voice("pico", n) for n in PICO_VOICES) if not is_reserved(v)]


def speak(lib: Path, job: Job) -> np.ndarray:
    """One utterance as float32 at 16 kHz (Pico's own rate), peak -1 dBFS."""
    import ctts  # from `lib`, on sys.path

    engine = _engines.get(job.voice.name)
    if engine is None:
        engine = _engines[job.voice.name] = ctts.engine_create(language_dir=str(lib / "lang"),
                                                               language=job.voice.name)
    ctts.engine_set_property(engine, "rate", round(100 * job.prosody.speed))
    ctts.engine_set_property(engine, "pitch", round(100 * (1 + PITCH_RANGE * job.prosody.pitch)))
    chunks: list[bytes] = []
    ctts.engine_speak(engine, job.text, lambda fmt, audio, fin: chunks.append(audio) or True)
    audio = np.frombuffer(b"".join(chunks), dtype="<i2").astype(np.float32) / 32768
    peak = float(np.abs(audio).max()) if audio.size else 0.0
    return audio * (PEAK / peak) if peak > 1e-3 else audio[:0]


def run_chunk(args: tuple[Path, Path, list[Job]]) -> list[dict[str, Any]]:
    """Synthesise jobs into OUT; the manifest rows of those that worked."""
    lib, out, jobs = args
    if str(lib) not in sys.path:
        sys.path.insert(0, str(lib))
    rows = []
    for job in jobs:
        audio = speak(lib, job)
        if audio.size < SAMPLE_RATE // 10:
            continue
        write_wav(out / job.audio, audio)
        rows.append({"audio": job.audio, "text": job.text, "voice": job.voice.id, "engine": "pico",
                     "duration": round(audio.size / SAMPLE_RATE, 3), "speed": job.prosody.speed,
                     "pitch": job.prosody.pitch})
    return rows


def synthesize(sentences: list[str], lib: Path, n: int, out: Path, workers: int, seed: int
               ) -> dict[str, float]:
    """N utterances under OUT with OUT/manifest.jsonl (ordered by index); return stats."""
    jobs = plan(sentences, pico_voices(), n, seed)
    start = time.perf_counter()
    tasks = [(lib.resolve(), out, jobs[i:i + CHUNK]) for i in range(0, len(jobs), CHUNK)]
    with multiprocessing.Pool(workers) as pool:
        rows = sorted((r for rows in pool.imap_unordered(run_chunk, tasks) for r in rows),
                      key=lambda r: r["audio"])
    with open(out / "manifest.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    wall, seconds = time.perf_counter() - start, sum(r["duration"] for r in rows)
    return {"utterances": len(rows), "failed": n - len(rows), "hours": round(seconds / 3600, 4),
            "wall_s": round(wall, 2), "audio_s_per_wall_s": round(seconds / wall, 1)}


def pack_lib(wheels: Path, out: Path) -> list[str]:
    """The `ctts` extensions of the ttspico wheels in WHEELS and the English language files, as a
    tar.xz of a `pico/` folder (`pico/ctts.*.so`, `pico/lang/*.bin`); return the names packed."""
    names = []
    with tarfile.open(out, "w:xz") as tar:
        for wheel in sorted(wheels.glob("ttspico-*.whl")):
            with zipfile.ZipFile(wheel) as z:
                for member in z.infolist():
                    name = Path(member.filename).name
                    if name.startswith("ctts.") or (name in LANG_FILES and f"pico/lang/{name}" not in names):
                        target = f"pico/lang/{name}" if name.endswith(".bin") else f"pico/{name}"
                        info = tarfile.TarInfo(target)
                        data = z.read(member)
                        info.size, info.mode = len(data), 0o755 if name.endswith(".so") else 0o644
                        tar.addfile(info, io.BytesIO(data))
                        names.append(target)
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="synthesise")
    m.add_argument("--lib", type=Path, required=True, help="the unpacked pico/ folder")
    m.add_argument("--text", type=Path, required=True)
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--n", type=int, default=1000)
    m.add_argument("--workers", type=int, default=multiprocessing.cpu_count())
    m.add_argument("--seed", type=int, default=20)
    p = sub.add_parser("pack-lib", help="pack ttspico's extensions and English voices")
    p.add_argument("--wheels", type=Path, required=True, help="folder of built ttspico wheels")
    p.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.cmd == "pack-lib":
        print(json.dumps({"packed": pack_lib(args.wheels, args.out), "bytes": args.out.stat().st_size}))
        return
    sentences = [s for s in args.text.read_text().splitlines() if s.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(synthesize(sentences, args.lib, args.n, args.out, args.workers, args.seed)))


if __name__ == "__main__":
    main()
