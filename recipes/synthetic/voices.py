"""Training and evaluation voices of the TTS engines, and per-utterance voice + prosody sampling.

Reserved voices (shared/data/recipe.md) never appear among the training voices; they make the
evaluation voice list. Names are compared case-insensitively.

    python -m recipes.synthetic.voices [--engines-root DIR] [--eval]    lists the voices
"""
from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from .tts import TTS

# espeak-ng accents. British is `en`: `en-gb+VARIANT` silently ignores the variant.
ESPEAK_NG_ACCENTS = ("en", "en-us", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp",
                     "en-gb-x-gbcwmd", "en-029")
# espeak 1.48 accents by voice file name: `en-uk-rp+VARIANT` (the language name) gives plain `en`.
ESPEAK_ACCENTS = ("en", "en-us", "en-sc", "en-n", "en-rp", "en-wm", "en-wi")
FLITE_VOICES = ("kal16", "awb", "rms")
FESTIVAL_VOICES = ("kal_diphone", "ked_diphone")

# espeak-ng variants that sound the same as another voice at a given -s (see synth --check-voices):
# `fast` only changes the rate; `caleb` and `klatt6` equal `klatt`.
DUPLICATE_ESPEAK_NG_VARIANTS = frozenset({"fast", "caleb", "klatt6"})
RESERVED_ESPEAK_NG_ACCENTS = frozenset({"en-us-nyc"})
RESERVED_ESPEAK_NG_VARIANTS = frozenset(v.lower() for v in (
    "Annie", "Alicia", "Andrea", "belinda", "linda", "steph", "steph2", "steph3", "f5", "m8",
    "grandma", "grandpa", "Storm", "travis", "victor", "shelby", "anika", "norbert", "edward",
    "edward2"))
RESERVED_ESPEAK_VARIANTS = frozenset({"f5"})
RESERVED_SPEAKER = "slt"  # flite slt and festival cmu_us_slt_arctic_hts
# Kokoro-82M's native English voices (shared/data/voices.md): a/b = US/GB, f/m = woman/man.
KOKORO_VOICES = (
    "af_alloy", "af_aoede", "af_bella", "af_heart", "af_jessica", "af_kore", "af_nicole", "af_nova",
    "af_river", "af_sarah", "af_sky", "am_adam", "am_echo", "am_eric", "am_fenrir", "am_liam",
    "am_michael", "am_onyx", "am_puck", "am_santa", "bf_alice", "bf_emma", "bf_isabella", "bf_lily",
    "bm_daniel", "bm_fable", "bm_george", "bm_lewis")
RESERVED_KOKORO_VOICES = frozenset({"af_nicole", "am_michael", "bf_emma", "bm_lewis"})
PICO_VOICES = ("en-US", "en-GB")
EVAL_ESPEAK_NG_ACCENTS = ("en-us-nyc", "en-us", "en")
EVAL_ESPEAK_ACCENTS = ("en-us", "en")

ENGINE_WEIGHTS = {"espeak-ng": 0.4, "espeak": 0.2, "flite": 0.25, "festival": 0.15}
# Kokoro and Pico speech is made apart (kokoro.py, pico.py), each engine on its own.
ENGINE_WEIGHTS |= {"kokoro": 1.0, "pico": 1.0}


@dataclass(frozen=True)
class Voice:
    """An engine and the voice name it is given (`en-us+m3`, `awb`, `kal_diphone`)."""

    engine: str
    name: str

    @property
    def id(self) -> str:
        return f"{self.engine}:{self.name}"


@dataclass(frozen=True)
class Prosody:
    """Relative speaking rate (1 = the engine's default) and pitch shift in [-1, 1]."""

    speed: float
    pitch: float


def kokoro_parts(name: str) -> list[tuple[str, float]]:
    """A Kokoro voice name as (voice, weight) parts: `af_bella` or `af_bella:0.6+bm_george:0.4`."""
    parts = []
    for part in name.lower().split("+"):
        base, _, weight = part.partition(":")
        parts.append((base, float(weight) if weight else 1.0))
    return parts


def is_reserved(voice: Voice) -> bool:
    """Whether a voice is reserved for evaluation (any Piper voice too; a Kokoro blend that
    contains a reserved voice, with any weight)."""
    name = voice.name.lower()
    accent, _, variant = name.partition("+")
    if voice.engine == "kokoro":
        return any(base in RESERVED_KOKORO_VOICES for base, _ in kokoro_parts(name))
    if voice.engine == "espeak-ng":
        return accent in RESERVED_ESPEAK_NG_ACCENTS or variant in RESERVED_ESPEAK_NG_VARIANTS
    if voice.engine == "espeak":
        return variant in RESERVED_ESPEAK_VARIANTS
    return voice.engine == "piper" or RESERVED_SPEAKER in name


def all_voices(tts: TTS) -> list[Voice]:
    """Every voice of the engines installed (reserved ones included), variants as on disk."""
    voices: list[Voice] = []
    if tts.installed("espeak-ng"):
        accents = ESPEAK_NG_ACCENTS + tuple(sorted(RESERVED_ESPEAK_NG_ACCENTS))
        variants = ["", *("+" + v for v in tts.espeak_ng_variants()
                          if v.lower() not in DUPLICATE_ESPEAK_NG_VARIANTS)]
        voices += [Voice("espeak-ng", a + v) for a in accents for v in variants]
    if tts.installed("espeak"):
        variants = ["", *("+" + v for v in tts.espeak_variants())]
        voices += [Voice("espeak", a + v) for a in ESPEAK_ACCENTS for v in variants]
    voices += [Voice("flite", v) for v in tts.flite_voices()]
    if tts.installed("festival"):
        voices += [Voice("festival", v) for v in tts.festival_voices()]
    return voices


def training_voices(tts: TTS) -> list[Voice]:
    """Voices to train on: the recipe's voices the engines have, reserved ones excluded."""
    allowed = {"flite": FLITE_VOICES, "festival": FESTIVAL_VOICES}
    return [v for v in all_voices(tts)
            if not is_reserved(v) and (v.engine not in allowed or v.name in allowed[v.engine])]


def eval_voices(tts: TTS) -> list[Voice]:
    """Reserved voices the engines have: en-us-nyc, the reserved variants on a few accents, slt."""
    def wanted(v: Voice) -> bool:
        accent, _, variant = v.name.lower().partition("+")
        if v.engine == "espeak-ng":
            return accent in EVAL_ESPEAK_NG_ACCENTS and (
                variant in RESERVED_ESPEAK_NG_VARIANTS or not variant)
        if v.engine == "espeak":
            return accent in EVAL_ESPEAK_ACCENTS
        return True
    return [v for v in all_voices(tts) if is_reserved(v) and wanted(v)]


def kokoro_training_voices() -> list[Voice]:
    """The 24 native English Kokoro voices that are not reserved."""
    return [v for v in (Voice("kokoro", n) for n in KOKORO_VOICES) if not is_reserved(v)]


def kokoro_eval_voices() -> list[Voice]:
    """The 4 reserved Kokoro voices: evaluation only."""
    return [v for v in (Voice("kokoro", n) for n in KOKORO_VOICES) if is_reserved(v)]


def kokoro_blends(n: int, seed: int) -> list[Voice]:
    """N new speakers: convex blends of 2 or 3 non-reserved Kokoro voices (seeded weights,
    largest first, rounded to 0.01 and summing to 1)."""
    rng = random.Random(seed)
    bases = [v.name for v in kokoro_training_voices()]
    out: list[Voice] = []
    while len(out) < n:
        names = rng.sample(bases, rng.choice((2, 2, 3)))
        raw = [rng.gammavariate(1.0, 1.0) + 0.2 for _ in names]
        weights = [round(w / sum(raw), 2) for w in raw]
        weights[0] = round(1 - sum(weights[1:]), 2)
        parts = sorted(zip(weights, names), reverse=True)
        voice = Voice("kokoro", "+".join(f"{b}:{w:.2f}" for w, b in parts))
        if voice not in out:
            out.append(voice)
    return out


def sample_voice(rng: random.Random, voices: list[Voice],
                 weights: dict[str, float] = ENGINE_WEIGHTS) -> Voice:
    """An engine by weight (among those in `voices`), then one of its voices uniformly."""
    by_engine: dict[str, list[Voice]] = {}
    for v in voices:
        by_engine.setdefault(v.engine, []).append(v)
    engines = sorted(by_engine)
    engine = rng.choices(engines, [weights.get(e, 0.0) for e in engines])[0]
    return rng.choice(by_engine[engine])


def sample_prosody(rng: random.Random) -> Prosody:
    """Speaking rate 0.8..1.2 and pitch -1..1, uniform."""
    return Prosody(speed=round(rng.uniform(0.8, 1.2), 3), pitch=round(rng.uniform(-1.0, 1.0), 3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--engines-root", type=Path, help="unpacked engines (default: the system's)")
    ap.add_argument("--eval", action="store_true", help="list the evaluation voices instead")
    args = ap.parse_args()
    tts = TTS(args.engines_root or Path("/"))
    voices = eval_voices(tts) if args.eval else training_voices(tts)
    for v in voices:
        print(v.id)
    counts = {e: sum(v.engine == e for v in voices) for e in ENGINE_WEIGHTS}
    print(f"{len(voices)} voices: {counts}", file=sys.stderr)


if __name__ == "__main__":
    main()
