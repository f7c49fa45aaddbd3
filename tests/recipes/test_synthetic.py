"""Tests of the synthetic-speech data pipeline (recipes/synthetic)."""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import wave
from pathlib import Path

import pytest
import torch

from recipes.synthetic import augment, ngrams
from recipes.synthetic.tts import TTS
from recipes.synthetic.voices import (
    RESERVED_ESPEAK_NG_VARIANTS,
    Voice,
    eval_voices,
    is_reserved,
    training_voices,
)

RESERVED_FILE = Path(__file__).resolve().parents[2].parent / "shared/data/reserved-6grams.txt"


def fake_root(tmp_path: Path) -> TTS:
    """An engines root with empty binaries and a few voice files, names in mixed case."""
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    for name in ("espeak-ng", "espeak", "festival", "flite_cmu_us_awb", "flite_cmu_us_slt",
                 "flite_cmu_us_kal16"):
        (tmp_path / "usr/bin").mkdir(parents=True, exist_ok=True)
        (tmp_path / "usr/bin" / name).touch()
    for v in ("m3", "Storm", "ANNIE", "f5", "klatt", "caleb", "Mr serious"):
        (lib / "espeak-ng-data/voices/!v").mkdir(parents=True, exist_ok=True)
        (lib / "espeak-ng-data/voices/!v" / v).touch()
    for v in ("f5", "m1"):
        (lib / "espeak-data/voices/!v").mkdir(parents=True, exist_ok=True)
        (lib / "espeak-data/voices/!v" / v).touch()
    for v in ("kal_diphone", "cmu_us_slt_arctic_hts"):
        (tmp_path / "usr/share/festival/voices/english" / v).mkdir(parents=True)
    return TTS(tmp_path)


def test_is_reserved_is_case_insensitive() -> None:
    for v in [Voice("espeak-ng", "en-us+storm"), Voice("espeak-ng", "en+Storm"),
              Voice("espeak-ng", "en-US-nyc"), Voice("espeak-ng", "en-us-nyc+m3"),
              Voice("espeak-ng", "en+ANNIE"), Voice("espeak", "en-us+F5"), Voice("flite", "SLT"),
              Voice("festival", "cmu_us_slt_arctic_hts"), Voice("piper", "en_US-amy")]:
        assert is_reserved(v), v
    for v in [Voice("espeak-ng", "en-us+m3"), Voice("espeak", "en+m1"), Voice("flite", "awb"),
              Voice("festival", "kal_diphone")]:
        assert not is_reserved(v), v


def test_reserved_voices_only_in_eval_list(tmp_path: Path) -> None:
    tts = fake_root(tmp_path)
    train, held = training_voices(tts), eval_voices(tts)
    assert train and not any(is_reserved(v) for v in train)
    assert all(is_reserved(v) for v in held)
    ids = {v.id for v in held}
    assert {"espeak-ng:en-us-nyc", "espeak-ng:en-us+Storm", "espeak-ng:en+ANNIE",
            "espeak-ng:en-us+f5", "espeak:en-us+f5", "flite:slt",
            "festival:cmu_us_slt_arctic_hts"} <= ids
    names = {v.name for v in train}
    assert "en-us+m3" in names and "en+klatt" in names
    assert not {"en+caleb", "en+Mr serious", "en-gb+m3"} & names  # duplicates, spaces, ignored


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_every_installed_reserved_variant_is_in_eval_list() -> None:
    tts = TTS()
    installed = {v for v in tts.espeak_ng_variants() if v.lower() in RESERVED_ESPEAK_NG_VARIANTS}
    assert installed, "no reserved variant found: wrong espeak-ng-data path?"
    held = {v.name for v in eval_voices(tts) if v.engine == "espeak-ng"}
    assert "en-us-nyc" in held and {"en-us+" + v for v in installed} <= held
    assert not any(is_reserved(v) for v in training_voices(tts))


def test_ngram_hash_follows_recipe_rule() -> None:
    text = "Don't STOP, believing: hold-on to that feeling!"
    assert ngrams.words(text) == ["don't", "stop", "believing", "hold", "on", "to", "that", "feeling"]
    assert ngrams.ngrams(text)[0] == "don't stop believing hold on to"
    expected = hashlib.sha1(b"don't stop believing hold on to").hexdigest()[:16]
    assert expected in ngrams.hashes(text) and len(ngrams.hashes(text)) == 3


def test_reserved_file_is_well_formed_and_real_text_passes() -> None:
    if not RESERVED_FILE.exists():
        pytest.skip(f"{RESERVED_FILE} is not there")
    reserved = ngrams.load_reserved(RESERVED_FILE)
    assert len(reserved) > 1000 and all(len(h) == 16 and int(h, 16) >= 0 for h in reserved)
    real = ["a bug in the code is worth two in the documentation",
            "she choked with emotion when she spoke about her deceased husband",
            "i can breathe better when the air is clean and the sun is out"]
    assert not ngrams.shares_ngram(real, reserved)


def test_clean_sentences_drops_reserved_6gram(tmp_path: Path) -> None:
    pytest.importorskip("num2words")
    from recipes.synthetic.text import clean_sentences

    secret = "The old lighthouse keeper counted 7 ships at dawn."
    reserved_file = tmp_path / "reserved.txt"
    reserved_file.write_text(ngrams.ngram_hash("lighthouse keeper counted seven ships at") + "\n")
    reserved = ngrams.load_reserved(reserved_file)
    kept, stats = clean_sentences({"test": [secret, "The keeper counted ships at dawn."]}, reserved)
    assert kept == ["the keeper counted ships at dawn"]
    assert stats["test"]["reserved"] == 1


@pytest.mark.parametrize("raw, label", [
    ("It costs $1,234.56.",
     "it costs one thousand two hundred and thirty four dollars and fifty six cents"),
    ("45% of 1,200 people", "forty five percent of one thousand two hundred people"),
    ("Call 555-123-4567", "call five five five one two three four five six seven"),
    ("at 7:05 pm or 10:00", "at seven oh five p m or ten o'clock"),
    ("the 21st of May, 1984", "the twenty first of may nineteen eighty four"),
    ("in the 1980s", "in the nineteen eighties"),
    ("Mr. Smith & the FBI", "mister smith and the f b i"),
    ("2 + 2 = 4", "two plus two equals four"),
    ("pi is 3.14", "pi is three point one four"),
    ("\u201cDon\u2019t,\u201d she said", "don't she said"),
])
def test_normalize_expands_numbers_and_symbols(raw: str, label: str) -> None:
    pytest.importorskip("num2words")
    from recipes.synthetic.normalize import normalize

    assert normalize(raw) == label


def test_split_is_deterministic_and_held_apart() -> None:
    pytest.importorskip("num2words")
    from recipes.synthetic.text import split

    sentences = [f"sentence number {i} is about topic {i % 7} and nothing else" for i in range(400)]
    a, b = split(sentences, seed=1, dev=0.1, held=0.1), split(sentences, seed=1, dev=0.1, held=0.1)
    assert a == b and a["dev"] and a["eval"]
    assert not set(a["train"]) & set(a["eval"]) and not set(a["train"]) & set(a["dev"])
    apart = {h for s in a["dev"] + a["eval"] for h in ngrams.hashes(s)}
    assert all(ngrams.hashes(s).isdisjoint(apart) for s in a["train"])


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([16000, 12000, 8000, 4000])
    x = 0.1 * torch.randn(4, 16000) * augment.valid_mask(lengths, 16000)
    return x, lengths


def test_augment_keeps_shape_dtype_and_is_seeded() -> None:
    x, lengths = _batch()
    on = augment.AugmentConfig(speed_prob=1, reverb_prob=1, noise_prob=1, telephone_prob=1,
                               mulaw_prob=1, gain_prob=1)
    y1, l1 = augment.augment(x, lengths, torch.Generator().manual_seed(7), on)
    y2, l2 = augment.augment(x, lengths, torch.Generator().manual_seed(7), on)
    y3, _ = augment.augment(x, lengths, torch.Generator().manual_seed(8), on)
    assert torch.equal(y1, y2) and torch.equal(l1, l2) and not torch.equal(y1, y3)
    assert y1.dtype == x.dtype and y1.shape == (4, int(l1.max())) and torch.isfinite(y1).all()
    assert ((l1.float() / lengths - 1).abs() <= 0.12).all()
    assert not (y1 * ~augment.valid_mask(l1, y1.shape[1])).any()
    half, _ = augment.augment(x.half(), lengths, torch.Generator().manual_seed(7), on)
    assert half.dtype == torch.float16 and torch.isfinite(half).all()


def test_augment_off_is_identity() -> None:
    x, lengths = _batch()
    off = augment.AugmentConfig(speed_prob=0, reverb_prob=0, noise_prob=0, telephone_prob=0,
                                mulaw_prob=0, gain_prob=0)
    y, l = augment.augment(x, lengths, torch.Generator().manual_seed(0), off)
    assert torch.equal(l, lengths) and torch.allclose(y, x)


def test_mulaw_code_is_an_8_bit_telephone_codec() -> None:
    x, lengths = _batch()
    y = augment.mulaw_code(x, torch.tensor([True, True, False, True]))
    assert torch.equal(y[2], x[2])
    assert len(torch.unique(y[[0, 1, 3]])) <= 255  # 8-bit codes
    err = (y[0] - x[0]).norm() / x[0].norm()
    assert 0 < err < 0.05  # quantisation noise ~ -30 dB and more below speech level


def test_nonspeech_replaces_only_the_chosen_rows_quietly() -> None:
    x, lengths = _batch()
    x = x.repeat(8, 1)
    lengths = lengths.repeat(8)
    chosen = torch.arange(32) % 3 != 0
    y1 = augment.nonspeech(x, lengths, chosen, torch.Generator().manual_seed(3))
    y2 = augment.nonspeech(x, lengths, chosen, torch.Generator().manual_seed(3))
    assert torch.equal(y1, y2) and torch.equal(y1[~chosen], x[~chosen])
    assert torch.isfinite(y1).all() and not (y1 * ~augment.valid_mask(lengths, 16000)).any()
    rms = (y1[chosen] ** 2).sum(1).div(lengths[chosen]).sqrt()
    assert (rms <= 10 ** (-15 / 20) * 1.01).all()  # at most -15 dBFS
    assert (rms == 0).any() and (rms > 0).sum() > 10  # digital silence among other sounds
    assert not torch.allclose(y1[chosen], x[chosen])


def test_speed_perturb_moves_a_tone() -> None:
    t = torch.arange(16000) / 16000
    tone = torch.sin(2 * torch.pi * 1000 * t)[None]
    y, lengths = augment.speed_perturb(tone, torch.tensor([16000]), torch.tensor([1.1]),
                                       torch.tensor([True]))
    assert int(lengths) == 14546
    peak_hz = torch.fft.rfft(y[0]).abs().argmax().item() * 16000 / y.shape[1]
    assert abs(peak_hz - 1100) < 5


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_synthesize_two_utterances(tmp_path: Path) -> None:
    from recipes.synthetic.synth import synthesize

    stats = synthesize(["hello world", "testing one two three"], [Voice("espeak-ng", "en-us")],
                       n=2, out=tmp_path, tts=TTS(), workers=2, seed=0)
    assert stats["utterances"] == 2 and stats["failed"] == 0
    rows = [json.loads(line) for line in (tmp_path / "manifest.jsonl").read_text().splitlines()]
    assert {r["text"] for r in rows} == {"hello world", "testing one two three"}
    for r in rows:
        assert r["voice"] == "espeak-ng:en-us" and r["engine"] == "espeak-ng"
        with wave.open(str(tmp_path / r["audio"])) as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
            assert abs(w.getnframes() / 16000 - r["duration"]) < 1e-3 and r["duration"] > 0.3


def test_resample_without_soxr_matches_length(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("scipy")
    import numpy as np

    from recipes.synthetic import synth

    monkeypatch.setattr(synth, "soxr", None)
    out = synth.resample(np.zeros(22050, dtype=np.float32), 22050)
    assert out.shape == (16000,) and out.dtype == np.float32


def test_conversation_templates_have_no_six_fixed_words() -> None:
    from recipes.synthetic.conversation import KINDS, _SLOT

    for templates in KINDS.values():
        for t in templates:
            for literal in _SLOT.split(t)[::2]:
                assert len(ngrams.words(literal)) < ngrams.N, t


def test_conversation_sentences_are_varied_seeded_and_spelled_out() -> None:
    pytest.importorskip("faker")
    pytest.importorskip("num2words")
    from recipes.synthetic.conversation import conversation_sentences
    from recipes.synthetic.normalize import normalize
    from recipes.synthetic.text import plausible

    raw = list(conversation_sentences(400, seed=3))
    assert raw == list(conversation_sentences(400, seed=3)) != list(conversation_sentences(400, seed=4))
    assert sum(s.endswith("?") for s in raw) > 50 and sum(any(c.isdigit() for c in s) for s in raw) > 50
    assert any(s.lower().startswith(("set a timer", "remind me", "turn off", "play some")) for s in raw)
    assert not any(re.search(r", [A-Z]", s) and re.search(r", (Is|What|How|Set|Turn) ", s) for s in raw)
    labels = [normalize(s) for s in raw if plausible(s)]
    assert len(labels) > 0.95 * len(raw)
    assert all(re.fullmatch(r"[a-z' ]+", label) for label in labels)
    assert len(set(labels)) > 300


def test_build_adds_conversation_and_filters_reserved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("faker")
    pytest.importorskip("num2words")
    from recipes.synthetic import text
    from recipes.synthetic.conversation import conversation_sentences

    first = normalize_first(conversation_sentences(1, seed=0))
    reserved = tmp_path / "reserved.txt"
    reserved.write_text("".join(ngrams.ngram_hash(g) + "\n" for g in ngrams.ngrams(first)))
    monkeypatch.setattr(text, "fortune_sentences", lambda: iter(["A fortune of several plain words here."]))
    monkeypatch.setattr(text, "wordnet_sentences", lambda: iter(["the usage example of a word"]))
    stats = text.build(tmp_path / "out", faker=50, seed=0, reserved_path=reserved, conversation=300)
    conv = stats["sources"]["conversation"]
    assert conv["raw"] == 300 and conv["kept"] > 200 and conv["reserved"] >= 1
    lines = [line for p in text.SPLITS for line in (tmp_path / "out" / f"{p}.txt").read_text().splitlines()]
    assert first not in lines and not any(ch.isdigit() for line in lines for ch in line)


def normalize_first(sentences: object) -> str:
    from recipes.synthetic.normalize import normalize

    return normalize(next(iter(sentences)))  # type: ignore[call-overload]
