"""The shipped default model, served with no model flag, transcribes speech made at test time."""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from daemon import config, running, stream_pcm
from recipes.wer import wer
from streamd.model.checkpoint import DEFAULT_MODEL

# Not from the training text; spoken by espeak-ng's default American voice (a training voice).
SENTENCES = [
    "please call me back in ten minutes",
    "the weather is nice today",
    "we will meet at the train station tomorrow morning",
    "open the door and turn on the light",
]
MAX_WER = 10.0  # percent; the shipped step-4000, step-1947 and step-4701 models get 0.0 on these (step 4103: 6.9)

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng (.ci/run installs it)")


def speak(text: str, path: Path) -> bytes:
    """espeak-ng's WAV (22.05 kHz) as s16le bytes; the daemon resamples."""
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(path), text], check=True)
    pcm, rate = sf.read(str(path), dtype="int16")
    assert rate == 22050
    return np.asarray(pcm, dtype="<i2").tobytes()


def serve_default_model(audio: list[bytes], rate: int) -> list[str]:
    """Each s16le clip streamed at once to a daemon started with no model flag: its finals' text."""
    async def main() -> list[str]:
        async with running(config(model=None)) as (_, url):
            start = {"type": "start", "sample_rate": rate, "encoding": "s16le"}
            rng = np.random.default_rng(0)
            transcripts = await asyncio.gather(*(stream_pcm(url, pcm, rng, start) for pcm in audio))
        return [" ".join(f["text"] for f in t.of("final")) for t in transcripts]

    return asyncio.run(main())


def test_shipped_model_transcribes_espeak_speech_through_the_daemon(tmp_path: Path) -> None:
    assert DEFAULT_MODEL.exists() and DEFAULT_MODEL.stat().st_size <= 25_000_000
    audio = [speak(s, tmp_path / f"{i}.wav") for i, s in enumerate(SENTENCES)]

    hyps = serve_default_model(audio, 22050)
    score = wer(zip(SENTENCES, hyps))
    print("\n".join(f"{r!r} -> {h!r}" for r, h in zip(SENTENCES, hyps)), f"WER {score:.1f}%")
    assert score <= MAX_WER, list(zip(SENTENCES, hyps))


# Ten clips of real people from the real-speech corpus's dev split (never trained on): CMU AN4
# test speakers, Common Voice and LibriSpeech test-other (tests/fixtures/real-speech/README.md).
REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real-speech"
MAX_REAL_WER = 50.0  # percent (41 of these 82 words); the shipped 2026-12-04e gets 46.3 on these, 2026-12-04c 48.8, step 4000 43.9, step 1947 46.3, the synthetic-only step 4701 68.3


def test_shipped_model_transcribes_real_people_through_the_daemon() -> None:
    rows = [json.loads(line) for line in (REAL / "manifest.jsonl").read_text().splitlines()]
    audio = [np.asarray(sf.read(str(REAL / r["audio"]), dtype="int16")[0], dtype="<i2").tobytes() for r in rows]

    hyps = serve_default_model(audio, 16000)
    score = wer(zip((r["text"] for r in rows), hyps))
    print("\n".join(f"{r['text']!r} -> {h!r}" for r, h in zip(rows, hyps)), f"WER {score:.1f}%")
    assert score <= MAX_REAL_WER, list(zip((r["text"] for r in rows), hyps))
