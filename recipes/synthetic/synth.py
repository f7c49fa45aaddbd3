"""Synthesise a corpus in parallel: 16 kHz mono 16-bit WAV files and a JSONL manifest.

    python -m recipes.synthetic.synth --text DIR/train.txt --voices train --n 100000 \\
        --out OUT [--engines-root .carry/tts/root] [--workers 16] [--seed 0]
    python -m recipes.synthetic.synth --check-voices [--voices train] [--engines-root ...]

Each manifest line: audio (path relative to the manifest), text, voice, engine, duration,
speed, pitch. Sentences, voices and prosody are drawn from the seed, so a run is reproducible
(engines add a little noise of their own). Festival runs one process per batch of utterances.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import random
import resource
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .tts import TTS
from .voices import Prosody, Voice, eval_voices, sample_prosody, sample_voice, training_voices

try:
    import soxr
except ImportError:  # the GPU image has scipy but not soxr
    soxr = None

SAMPLE_RATE = 16000
PEAK = 10 ** (-1 / 20)  # peak-normalise to -1 dBFS
CHUNK = {"festival": 200}  # utterances per worker task; festival: per process
DEFAULT_CHUNK = 50
PROBE = "The quick brown fox jumped over thirty seven lazy dogs while Xavier's psychologist whispered."


@dataclass(frozen=True)
class Job:
    """One utterance to make."""

    index: int
    text: str
    voice: Voice
    prosody: Prosody

    @property
    def audio(self) -> str:
        """Path of its WAV file, relative to the output folder."""
        return f"audio/{self.index // 1000:04d}/{self.index:07d}.wav"


def plan(sentences: list[str], voices: list[Voice], n: int, seed: int) -> list[Job]:
    """N jobs: sentences in a seeded order (all used before any repeats), voice and prosody drawn."""
    rng = random.Random(seed)
    order = list(range(len(sentences)))
    jobs = []
    for i in range(n):
        if i % len(order) == 0:
            rng.shuffle(order)
        jobs.append(Job(i, sentences[order[i % len(order)]], sample_voice(rng, voices),
                        sample_prosody(rng)))
    return jobs


def chunks(jobs: list[Job]) -> list[list[Job]]:
    """Worker tasks: jobs grouped by engine (festival also by voice), in bounded chunks."""
    groups: dict[tuple[str, str], list[Job]] = {}
    for j in jobs:
        key = (j.voice.engine, j.voice.name if j.voice.engine == "festival" else "")
        groups.setdefault(key, []).append(j)
    out = []
    for (engine, _), group in sorted(groups.items()):
        size = CHUNK.get(engine, DEFAULT_CHUNK)
        out += [group[i:i + size] for i in range(0, len(group), size)]
    return sorted(out, key=lambda c: c[0].index)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A 16-bit PCM WAV file as float32 mono in [-1, 1] and its rate."""
    with wave.open(str(path), "rb") as w:
        rate, channels = w.getframerate(), w.getnchannels()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.reshape(-1, channels).mean(axis=1).astype(np.float32) / 32768.0, rate


def write_wav(path: Path, audio: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    """Float audio in [-1, 1] as 16-bit PCM mono WAV."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(audio, -1, 1) * 32767).round().astype("<i2").tobytes())


def resample(audio: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """Band-limited resampling with soxr, or scipy's polyphase filter where soxr is missing."""
    if rate == target:
        return audio
    if soxr is not None:
        return soxr.resample(audio, rate, target, quality="HQ").astype(np.float32)
    from scipy.signal import resample_poly

    g = math.gcd(rate, target)
    return resample_poly(audio, target // g, rate // g).astype(np.float32)


def engine_command(tts: TTS, job: Job, out: Path) -> list[str]:
    """The command that writes one utterance (not festival: see festival_script)."""
    v, p = job.voice, job.prosody
    if v.engine in ("espeak-ng", "espeak"):
        wpm, pitch = round(170 * p.speed), round(50 + 20 * p.pitch)
        make = tts.espeak_ng_cmd if v.engine == "espeak-ng" else tts.espeak_cmd
        return make(v.name, wpm, pitch, job.text, out)
    if v.engine == "flite":
        f0 = 130 + 40 * p.pitch if v.name == "kal16" else None
        return tts.flite_cmd(v.name, 1 / p.speed, f0, job.text, out)
    raise ValueError(f"no single-utterance command for {v.id}")


def festival_script(jobs: list[Job], paths: list[Path]) -> str:
    """A Scheme batch for one festival process; an utterance that fails does not stop the rest."""
    lines = [f"(voice_{jobs[0].voice.name})"]
    for job, path in zip(jobs, paths):
        text = job.text.replace("\\", " ").replace('"', " ")
        f0 = 105 + 30 * job.prosody.pitch
        lines += [
            f"(Parameter.set 'Duration_Stretch {1 / job.prosody.speed:.3f})",
            (f"(set! int_lr_params '((target_f0_mean {f0:.0f}) (target_f0_std 14) "
             "(model_f0_mean 170) (model_f0_std 34)))"),
            f'(unwind-protect (utt.save.wave (utt.synth (Utterance Text "{text}")) "{path}" \'riff) nil)',
        ]
    return "\n".join(lines) + "\n"


def run_chunk(args: tuple[TTS, Path, list[Job]]) -> list[dict[str, Any]]:
    """Synthesise a chunk into the output folder; return the manifest rows of those that worked."""
    tts, out, jobs = args
    rows = []
    with tempfile.TemporaryDirectory(prefix="synth-") as tmp:
        raw = [Path(tmp) / f"{j.index}.wav" for j in jobs]
        env = tts.env()
        if jobs[0].voice.engine == "festival":
            script = Path(tmp) / "batch.scm"
            script.write_text(festival_script(jobs, raw))
            _run(tts.festival_cmd(script), env, timeout=60 + 10 * len(jobs))
        else:
            for job, path in zip(jobs, raw):
                _run(engine_command(tts, job, path), env, timeout=60)
        for job, path in zip(jobs, raw):
            row = finish(job, path, out)
            if row:
                rows.append(row)
    return rows


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> None:
    """Run an engine; a failure or hang shows as a missing output file."""
    try:
        subprocess.run(cmd, env=env, capture_output=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


def finish(job: Job, raw: Path, out: Path) -> dict[str, Any] | None:
    """Resample, normalise and store one engine output; its manifest row, or None if it failed."""
    try:
        audio, rate = read_wav(raw)
    except (OSError, EOFError, wave.Error):
        return None
    audio = resample(audio, rate)
    peak = float(np.abs(audio).max()) if audio.size else 0.0
    if peak < 1e-3 or audio.size < SAMPLE_RATE // 10:
        return None
    write_wav(out / job.audio, audio * (PEAK / peak))
    return {"audio": job.audio, "text": job.text, "voice": job.voice.id, "engine": job.voice.engine,
            "duration": round(audio.size / SAMPLE_RATE, 3), "speed": job.prosody.speed,
            "pitch": job.prosody.pitch}


def run_parallel(tts: TTS, out: Path, jobs: list[Job], workers: int) -> Iterator[dict[str, Any]]:
    """Manifest rows of the jobs, made by a pool of worker processes (rows in no fixed order)."""
    tasks = [(tts, out, c) for c in chunks(jobs)]
    with multiprocessing.Pool(workers) as pool:
        for rows in pool.imap_unordered(run_chunk, tasks):
            yield from rows


def synthesize(sentences: list[str], voices: list[Voice], n: int, out: Path, tts: TTS,
               workers: int, seed: int) -> dict[str, float]:
    """Make N utterances under OUT with OUT/manifest.jsonl (ordered by index); return stats."""
    jobs = plan(sentences, voices, n, seed)
    start, cpu0 = time.perf_counter(), _cpu_seconds()
    rows = sorted(run_parallel(tts, out, jobs, workers), key=lambda r: r["audio"])
    wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu0
    with open(out / "manifest.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    hours = sum(r["duration"] for r in rows) / 3600
    return {"utterances": len(rows), "failed": n - len(rows), "hours": round(hours, 4),
            "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "audio_s_per_wall_s": round(hours * 3600 / wall, 1),
            "audio_s_per_cpu_s": round(hours * 3600 / max(cpu, 1e-9), 1)}


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (engines included)."""
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def check_voices(tts: TTS, voices: list[Voice], workers: int) -> dict[str, list]:
    """Voices that fail, and groups whose audio for a probe sentence is identical (an ignored name)."""
    jobs = [Job(i, PROBE, v, Prosody(1.0, 0.0)) for i, v in enumerate(voices)]
    with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
        rows = list(run_parallel(tts, Path(tmp), jobs, workers))
        by_hash: dict[str, list[str]] = {}
        for r in rows:
            digest = hashlib.sha1((Path(tmp) / r["audio"]).read_bytes()).hexdigest()
            by_hash.setdefault(digest, []).append(r["voice"])
    return {"failed": sorted({v.id for v in voices} - {r["voice"] for r in rows}),
            "identical": [sorted(g) for g in by_hash.values() if len(g) > 1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--text", type=Path, help="sentences, one a line")
    ap.add_argument("--voices", choices=("train", "eval"), default="train")
    ap.add_argument("--engines", help="comma-separated engines to use (default: all)")
    ap.add_argument("--n", type=int, default=1000, help="utterances to make")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--engines-root", type=Path, help="unpacked engines (default: the system's)")
    ap.add_argument("--workers", type=int, default=multiprocessing.cpu_count())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-voices", action="store_true",
                    help="report voices that sound identical or fail, then exit")
    args = ap.parse_args()
    tts = TTS(args.engines_root.resolve() if args.engines_root else Path("/"))
    voices = (eval_voices if args.voices == "eval" else training_voices)(tts)
    if args.engines:
        voices = [v for v in voices if v.engine in args.engines.split(",")]
    if not voices:
        sys.exit("no voices: are the engines installed (or --engines-root right)?")
    if args.check_voices:
        report = check_voices(tts, voices, args.workers)
        print(json.dumps({"voices": len(voices), **report}, indent=1))
        sys.exit(1 if report["failed"] or report["identical"] else 0)
    if not (args.text and args.out):
        ap.error("--text and --out are needed")
    sentences = [s for s in args.text.read_text().splitlines() if s.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    stats = synthesize(sentences, voices, args.n, args.out, tts, args.workers, args.seed)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
