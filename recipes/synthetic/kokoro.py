"""Kokoro-82M speech made on this (CPU) machine: non-reserved voices and blends, varied speed and
pitch, 16 kHz mono Ogg/Opus (~16 kbit/s) and a manifest in synth.py's format.

    python -m recipes.synthetic.kokoro --model kokoro-int8.onnx --voices DIR --text train.txt \\
        --out .carry/kokoro/train --n 100000 --seed 10 [--blends 48] [--threads 1]
    python -m recipes.synthetic.kokoro --eval --voices EVAL_DIR --text eval.txt --out OUT ...

--eval makes the reserved voices' speech (evaluation only, never training) from EVAL_DIR, which
holds only their style files; without it, only non-reserved voices can be made.

DIR holds kokoro-js's `voices/*.bin` (float32, 510 x 1 x 256). Runs need PyPI `kokoro-onnx`
(onnxruntime, espeakng-loader), `soundfile` and sox. Incremental: each utterance is appended to
OUT/manifest.jsonl as soon as it is written, and a rerun with the same arguments skips the indices
already there, so the job can be stopped at any time and `recipes.synthetic.carried pack` carries
whatever is finished.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .synth import PEAK, SAMPLE_RATE, Job, plan
from .voices import (
    Voice,
    is_reserved,
    kokoro_blends,
    kokoro_eval_voices,
    kokoro_parts,
    kokoro_training_voices,
)

KOKORO_RATE = 24000
PITCH_CENTS = 250  # pitch -1..1 -> -250..+250 cents through sox
OPUS_LEVEL = 0.96  # libsndfile's Opus compression level: ~16 kbit/s at 16 kHz


def audio_path(job: Job) -> str:
    """Path of an utterance's Ogg/Opus file, relative to the output folder."""
    return str(Path(job.audio).with_suffix(".opus"))


def lang_of(voice: Voice) -> str:
    """espeak language for the phonemes: British for a GB voice (the largest part of a blend)."""
    base = max(kokoro_parts(voice.name), key=lambda p: p[1])[0]
    return "en-gb" if base.startswith("b") else "en-us"


def style_of(voice: Voice, styles: dict[str, np.ndarray]) -> np.ndarray:
    """A voice's style table (510 x 1 x 256): the convex combination of its parts' tables."""
    return sum(w * styles[b] for b, w in kokoro_parts(voice.name)).astype(np.float32)


def load_styles(folder: Path, voices: list[Voice]) -> dict[str, np.ndarray]:
    """The style tables of the voices' parts from kokoro-js's .bin files."""
    names = sorted({b for v in voices for b, _ in kokoro_parts(v.name)})
    return {n: np.fromfile(folder / f"{n}.bin", dtype=np.float32).reshape(510, 1, 256) for n in names}


def shift_and_resample(audio: np.ndarray, cents: float) -> np.ndarray:
    """24 kHz float audio -> 16 kHz, pitch-shifted by `cents` (sox `pitch`, `rate -v`)."""
    raw = ["-t", "raw", "-e", "floating-point", "-b", "32", "-c", "1"]
    effects = (["pitch", f"{cents:.0f}"] if abs(cents) >= 5 else []) + ["rate", "-v", str(SAMPLE_RATE)]
    out = subprocess.run(["sox", *raw, "-r", str(KOKORO_RATE), "-", *raw, "-", *effects],
                         input=audio.astype(np.float32).tobytes(), capture_output=True, check=True)
    return np.frombuffer(out.stdout, dtype=np.float32)


def done_indices(manifest: Path) -> set[int]:
    """Indices of the utterances already in a manifest (from their file names)."""
    if not manifest.exists():
        return set()
    return {int(Path(json.loads(line)["audio"]).stem) for line in manifest.read_text().splitlines()
            if line.strip()}


class KokoroSynth:
    """The int8 ONNX model on `threads` CPU threads, with the voices' style tables."""

    def __init__(self, model: Path, voices: Path, speakers: list[Voice], threads: int) -> None:
        import onnxruntime as rt
        from kokoro_onnx import Kokoro

        opts = rt.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = threads
        session = rt.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        self.styles = load_styles(voices, speakers)
        # kokoro-onnx wants an .npz of voices; ours are passed as arrays, so one voice suffices.
        npz = voices / "kokoro-en.npz"
        if not npz.exists():
            np.savez(npz, **{k: self.styles[k] for k in list(self.styles)[:1]})
        self.kokoro = Kokoro.from_session(session, str(npz))

    def make(self, job: Job) -> np.ndarray:
        """One utterance at 16 kHz, peak -1 dBFS."""
        audio, _ = self.kokoro.create(job.text, voice=style_of(job.voice, self.styles),
                                      speed=job.prosody.speed, lang=lang_of(job.voice))
        audio = shift_and_resample(np.asarray(audio, dtype=np.float32), PITCH_CENTS * job.prosody.pitch)
        peak = float(np.abs(audio).max()) if audio.size else 0.0
        return audio * (PEAK / peak) if peak > 1e-3 else audio[:0]


def run(synth: KokoroSynth, jobs: list[Job], out: Path, reserved: bool = False) -> dict[str, Any]:
    """Make the jobs not yet in OUT/manifest.jsonl, appending each row as it is written; every
    voice must be reserved (evaluation) or every voice not (training), as `reserved` says."""
    import soundfile as sf

    out.mkdir(parents=True, exist_ok=True)
    manifest = out / "manifest.jsonl"
    skip = done_indices(manifest)
    made = seconds = 0.0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with open(manifest, "a") as f:
        for job in jobs:
            if job.index in skip:
                continue
            if is_reserved(job.voice) != reserved:
                raise ValueError(f"{job.voice.id}: reserved is {not reserved} here")
            audio = synth.make(job)
            if audio.size < SAMPLE_RATE // 10:
                continue
            path = out / audio_path(job)
            path.parent.mkdir(parents=True, exist_ok=True)
            sf.write(path, audio, SAMPLE_RATE, format="OGG", subtype="OPUS", compression_level=OPUS_LEVEL)
            duration = round(audio.size / SAMPLE_RATE, 3)
            f.write(json.dumps({"audio": audio_path(job), "text": job.text, "voice": job.voice.id,
                                "engine": "kokoro", "duration": duration,
                                "speed": job.prosody.speed, "pitch": job.prosody.pitch}) + "\n")
            f.flush()
            made, seconds = made + 1, seconds + duration
            if made % 50 == 0:
                cpu = time.process_time() - cpu0
                print(f"{made:.0f} made, {seconds / 60:.1f} min of audio, "
                      f"{seconds / cpu:.2f} s of audio per CPU s", file=sys.stderr, flush=True)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"utterances": int(made), "minutes": round(seconds / 60, 2), "cpu_s": round(cpu, 1),
            "wall_s": round(wall, 1), "audio_s_per_cpu_s": round(seconds / max(cpu, 1e-9), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="the joined int8 .onnx")
    ap.add_argument("--voices", type=Path, required=True, help="folder of kokoro-js voices/*.bin")
    ap.add_argument("--text", type=Path, required=True, help="sentences, one a line")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=10)
    ap.add_argument("--blends", type=int, default=48, help="blended speakers beside the 24 voices")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval", action="store_true", help="the reserved voices (evaluation only)")
    args = ap.parse_args()
    voices = kokoro_eval_voices() if args.eval else (
        kokoro_training_voices() + kokoro_blends(args.blends, seed=0))
    sentences = [s for s in args.text.read_text().splitlines() if s.strip()]
    stats = run(KokoroSynth(args.model, args.voices, voices, args.threads),
                plan(sentences, voices, args.n, args.seed), args.out, reserved=args.eval)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
