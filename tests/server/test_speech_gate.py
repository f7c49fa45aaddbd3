"""The speech gate (streamd.audio.activity, `[gate]`): silence, steady noise and tones give no
words through the daemon with the shipped model, while quiet speech and speech in noise keep
every word they have without the gate."""
from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

from daemon import TINY, running, stream_pcm
from streamd.audio.activity import Activity
from streamd.config import AdminConfig, Config, EngineConfig, GateConfig, ServerConfig

RATE = 16000
SENTENCES = ["please call me back in ten minutes", "open the door and turn on the light"]


def level(x: np.ndarray, dbfs: float) -> np.ndarray:
    """`x` scaled to an RMS of `dbfs` (0 dB: full scale)."""
    return x / np.sqrt(np.mean(x ** 2)) * 10 ** (dbfs / 20)


def pink(n: int, rng: np.random.Generator) -> np.ndarray:
    spectrum = np.fft.rfft(rng.normal(size=n))
    return np.fft.irfft(spectrum / np.sqrt(np.maximum(np.arange(spectrum.size), 1)), n)


def non_speech(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """10 s each of what a quiet room, a fan or a hum sends (what gave words before the gate)."""
    n, t = 10 * RATE, np.arange(10 * RATE) / RATE
    return {"digital silence": np.zeros(n), "quiet pink noise": level(pink(n, rng), -50),
            "pink noise": level(pink(n, rng), -30), "white noise": level(rng.normal(size=n), -20),
            "quiet white noise": level(rng.normal(size=n), -45), "440 Hz tone": 0.3 * np.sin(2 * np.pi * 440 * t),
            "quiet 1 kHz tone": level(np.sin(2 * np.pi * 1000 * t), -40)}


def espeak(text: str, path: Path) -> np.ndarray:
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(path), text], check=True)
    audio, rate = sf.read(str(path), dtype="float64")
    return soxr.resample(audio, rate, RATE)


def speech(tmp_path: Path, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each sentence quiet, normal, and in white and pink noise (SNR 10 and 5 dB), with a second of
    the same background before and after it."""
    out = {}
    for i, text in enumerate(SENTENCES):
        pad = np.zeros(RATE)
        clean = np.concatenate([pad, espeak(text, tmp_path / f"{i}.wav"), pad])
        out[f"{i} quiet -45 dBFS"] = level(clean, -45)
        out[f"{i} -25 dBFS"] = level(clean, -25)
        for snr in (10, 5):
            out[f"{i} white noise {snr} dB"] = level(clean, -25) + level(rng.normal(size=clean.size), -25 - snr)
        out[f"{i} pink noise 10 dB"] = level(clean, -25) + level(pink(clean.size, rng), -35)
    return out


def pcm16(x: np.ndarray) -> bytes:
    return np.rint(np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def active_frames(x: np.ndarray, pieces: list[int] | None = None) -> np.ndarray:
    a = Activity(RATE, GateConfig().min_dbfs, GateConfig().rise_db)
    for piece in np.split(x.astype(np.float32), pieces or list(range(1600, x.size, 1600))):
        a.push(piece)
    return np.array([a.active(i * 0.02, (i + 1) * 0.02) for i in range(a.frames)])


def test_activity_sees_speech_and_nothing_else(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for name, x in non_speech(rng).items():
        assert not active_frames(x).any(), name
    if shutil.which("espeak-ng") is None:
        return
    for name, x in speech(tmp_path, rng).items():
        flags = active_frames(x)
        assert flags.mean() > 0.1, name
        cuts = sorted(rng.integers(1, x.size, 40).tolist())  # any piece sizes: the same frames
        assert np.array_equal(active_frames(x, cuts), flags), name


def daemon_config(model: Path | None, gate: str) -> Config:
    return Config(server=ServerConfig(port=0, admission="max_streams", max_backlog_s=60),
                  engine=EngineConfig(model=model, device="cpu"), gate=GateConfig(mode=gate),
                  admin=AdminConfig(socket=None))


async def transcripts(cfg: Config, signals: dict[str, np.ndarray]) -> dict[str, tuple[str, str]]:
    """Per signal: the text of its finals, and of its last partial."""
    async with running(cfg) as (_, url):
        outs = await asyncio.gather(*(stream_pcm(url, pcm16(x), np.random.default_rng(0)) for x in signals.values()))
    return {name: (" ".join(f["text"] for f in o.of("final") if f["text"]),
                   " ".join(p["text"] for p in o.of("partial"))) for name, o in zip(signals, outs)}


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
def test_no_words_from_non_speech_and_every_word_of_speech(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    quiet, spoken = non_speech(rng), speech(tmp_path, rng)
    gated = asyncio.run(transcripts(daemon_config(None, "on"), {**quiet, **spoken}))
    assert {name: gated[name] for name in quiet} == {name: ("", "") for name in quiet}
    ungated = asyncio.run(transcripts(daemon_config(None, "off"), spoken))
    assert {name: gated[name][0] for name in spoken} == {name: ungated[name][0] for name in spoken}
    for i, text in enumerate(SENTENCES):  # the shipped model gets these right
        assert gated[f"{i} quiet -45 dBFS"][0] == gated[f"{i} -25 dBFS"][0] == text


def test_the_gate_is_the_default_and_can_be_turned_off() -> None:
    assert Config().gate == GateConfig("on", -70.0, 9.0)
    silence = {"silence": np.zeros(3 * RATE)}
    assert asyncio.run(transcripts(daemon_config(TINY, "off"), silence))["silence"][0]  # the tiny model's words
    assert asyncio.run(transcripts(daemon_config(TINY, "on"), silence))["silence"] == ("", "")
