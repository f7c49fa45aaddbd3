"""Tests of the Kokoro and Pico voice tables and of speech carried as Ogg/Opus (recipes/synthetic)."""
from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from recipes.synthetic import carried, ngrams
from recipes.synthetic.synth import plan
from recipes.synthetic.voices import (
    KOKORO_VOICES,
    RESERVED_KOKORO_VOICES,
    Voice,
    is_reserved,
    kokoro_blends,
    kokoro_parts,
    kokoro_training_voices,
)


def test_reserved_kokoro_voices_and_blends_are_reserved() -> None:
    assert RESERVED_KOKORO_VOICES == {"af_nicole", "am_michael", "bf_emma", "bm_lewis"}
    for name in ("af_nicole", "AM_MICHAEL", "bf_alice:0.99+bf_emma:0.01",
                 "af_bella:0.5+am_adam:0.3+bm_lewis:0.2"):
        assert is_reserved(Voice("kokoro", name)), name
    assert not is_reserved(Voice("kokoro", "af_bella:0.6+bm_george:0.4"))


def test_kokoro_training_voices_cover_accents_and_sexes_without_reserved() -> None:
    voices = kokoro_training_voices()
    names = {v.name for v in voices}
    assert len(voices) == 24 and names == set(KOKORO_VOICES) - RESERVED_KOKORO_VOICES
    assert {n[:2] for n in names} == {"af", "am", "bf", "bm"}


def test_no_reserved_voice_or_blend_can_be_selected_for_training() -> None:
    blends = kokoro_blends(300, seed=3)
    assert len({v.name for v in blends}) == 300
    for v in blends:
        parts = kokoro_parts(v.name)
        assert 2 <= len(parts) <= 3 and abs(sum(w for _, w in parts) - 1) < 1e-9
        assert all(w > 0 for _, w in parts) and not is_reserved(v)
    jobs = plan(["a b c"], kokoro_training_voices() + blends, n=5000, seed=1)
    used = {j.voice for j in jobs}
    assert len(used) > 250 and not any(is_reserved(v) for v in used)
    assert not {b for v in used for b, _ in kokoro_parts(v.name)} & RESERVED_KOKORO_VOICES


def test_kokoro_style_is_the_convex_blend_and_lang_follows_the_largest_part() -> None:
    from recipes.synthetic.kokoro import lang_of, style_of

    styles = {"af_bella": np.ones((510, 1, 256), np.float32),
              "bm_george": np.zeros((510, 1, 256), np.float32)}
    blend = Voice("kokoro", "bm_george:0.70+af_bella:0.30")
    assert np.allclose(style_of(blend, styles), 0.3)
    assert lang_of(blend) == "en-gb" and lang_of(Voice("kokoro", "af_bella")) == "en-us"


@pytest.mark.skipif(shutil.which("sox") is None, reason="sox is not installed")
def test_kokoro_pitch_shift_resamples_to_16k_and_keeps_length() -> None:
    from recipes.synthetic.kokoro import shift_and_resample

    t = np.arange(24000) / 24000
    tone = (0.5 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
    for cents in (0.0, 200.0):
        out = shift_and_resample(tone, cents)
        assert abs(out.size - 16000) < 200
        peak_hz = np.argmax(np.abs(np.fft.rfft(out[2000:14000]))) * 16000 / 12000
        assert abs(peak_hz - 200 * 2 ** (cents / 1200)) < 6


def write_set(folder: Path, texts: list[str]) -> None:
    """A set of Opus utterances, one tone each, with its manifest."""
    sf = pytest.importorskip("soundfile")
    rows = []
    for i, text in enumerate(texts):
        audio = f"audio/0000/{i:07d}.opus"
        (folder / audio).parent.mkdir(parents=True, exist_ok=True)
        t = np.arange(16000) / 16000
        sf.write(folder / audio, 0.5 * np.sin(2 * np.pi * (200 + 50 * i) * t), 16000,
                 format="OGG", subtype="OPUS", compression_level=0.96)
        rows.append({"audio": audio, "text": text, "voice": "kokoro:af_bella", "engine": "kokoro",
                     "duration": 1.0, "speed": 1.0, "pitch": 0.0})
    (folder / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"audio": ')


def test_read_audio_decodes_opus_like_soundfile(tmp_path: Path) -> None:
    sf = pytest.importorskip("soundfile")
    write_set(tmp_path, ["one two three"])
    pcm, rate = carried.read_audio(tmp_path / "audio/0000/0000000.opus")
    ref = sf.read(tmp_path / "audio/0000/0000000.opus", dtype="int16")[0]
    assert rate == 16000 and pcm.dtype == np.int16 and np.abs(pcm.astype(int) - ref).max() <= 1
    with pytest.raises(OSError):
        carried.read_audio(tmp_path / "manifest.jsonl")


def test_pack_filters_held_apart_budget_then_unpack_and_merge(tmp_path: Path) -> None:
    held = "the quick brown fox jumps over the lazy dog"
    train, dev = tmp_path / "sets/train", tmp_path / "sets/dev"
    texts = [f"sentence number {w} is here for you" for w in "one two three four five".split()]
    write_set(train, [texts[0], "so " + held + " again", *texts[1:]])
    write_set(dev, [held])
    (tmp_path / "dev.txt").write_text(held + "\n")
    out = tmp_path / "k.tar.xz"
    counts = carried.pack([dev, train, tmp_path / "sets/not-begun"], out, 10**6, [tmp_path / "dev.txt"])
    assert counts == {"dev": 1, "train": 5}  # the row sharing a 6-gram with dev.txt is dropped
    with tarfile.open(out) as tar:
        rows = [json.loads(x) for x in tar.extractfile("train/manifest.jsonl").read().splitlines()]
    assert [r["text"] for r in rows] == texts
    assert all(ngrams.hashes(r["text"]).isdisjoint(ngrams.hashes(held)) for r in rows)

    two = sum((train / f"audio/0000/{i:07d}.opus").stat().st_size for i in range(2))
    small = carried.pack([train], tmp_path / "s.tar.xz", two + 10, [])
    assert small == {"train": 2}

    counts = carried.unpack(out, tmp_path / "un", workers=1)
    assert counts == {"dev": 1, "train": 5}
    from recipes.data import read_manifest, read_pcm16

    utts = read_manifest(tmp_path / "un/train/manifest.jsonl")
    assert [u.text for u in utts] == texts and all(u.audio.endswith(".wav") for u in utts)
    assert all(abs(read_pcm16(u.audio).size - 16000) < 400 for u in utts)
    n = carried.merge([str(tmp_path / "un/train/manifest.jsonl"), f"{tmp_path}/un/dev/manifest.jsonl*3"],
                      tmp_path / "all.jsonl")
    merged = read_manifest(tmp_path / "all.jsonl")
    assert n == 8 and len(merged) == 8 and all(Path(u.audio).is_file() for u in merged)
    assert sorted(u.text for u in merged) == sorted(texts + [held] * 3)
    assert [u.text for u in merged] != texts + [held] * 3  # shuffled


def test_parts_made_by_separate_jobs_join_into_one_set_that_packs(tmp_path: Path) -> None:
    a, b = tmp_path / "train-a", tmp_path / "train-b"
    write_set(a, ["one thing said here", "two things said here"])
    write_set(b, ["three things said here"])
    assert carried.join([a, b], tmp_path / "train") == 3
    write_set(b, ["three things said here", "four things said here"])  # a job went on
    assert carried.join([a, b], tmp_path / "train") == 4  # joined again: the links stay
    counts = carried.pack([tmp_path / "train"], tmp_path / "k.tar.xz", 10**6, [])
    assert counts == {"train": 4}
    with tarfile.open(tmp_path / "k.tar.xz") as tar:
        rows = [json.loads(x) for x in tar.extractfile("train/manifest.jsonl").read().splitlines()]
        assert [r["audio"] for r in rows] == ["train-a/audio/0000/0000000.opus", "train-a/audio/0000/0000001.opus",
                                              "train-b/audio/0000/0000000.opus", "train-b/audio/0000/0000001.opus"]
        assert all(tar.getmember(f"train/{r['audio']}").isfile() for r in rows)  # the audio, not the links


def test_a_later_pack_carries_only_new_rows_and_a_pack_shrinks(tmp_path: Path) -> None:
    """gpu_carry.sh's kokoro2..: `--not-in` the earlier packs; recipes/rehearse.sh's small packs."""
    a, b = tmp_path / "train-a", tmp_path / "train-b"
    write_set(a, ["one thing said here", "two things said here"])
    write_set(b, ["three things said here", "four things said here", "five things said here"])
    carried.join([a, b], tmp_path / "train")
    dev = tmp_path / "dev"
    write_set(dev, ["a dev sentence here"])
    first = carried.pack([dev, tmp_path / "train"], tmp_path / "k1.tar.xz", 10**6, [])
    assert first == {"dev": 1, "train": 5}
    write_set(b, ["three things said here", "four things said here", "five things said here", "six things"])
    carried.join([a, b], tmp_path / "train")
    second = carried.pack([dev, tmp_path / "train"], tmp_path / "k2.tar.xz", 10**6, [],
                          not_in=[tmp_path / "k1.tar.xz"])
    assert second == {"dev": 0, "train": 1}  # only what the first pack does not carry
    with tarfile.open(tmp_path / "k2.tar.xz") as tar:
        rows = [json.loads(x) for x in tar.extractfile("train/manifest.jsonl").read().splitlines()]
        assert [r["text"] for r in rows] == ["six things"]
    small = carried.shrink(tmp_path / "k1.tar.xz", tmp_path / "k1s.tar.xz", rows=2)  # recipes/rehearse.sh's packs
    assert small == {"dev": 1, "train": 2}
    with tarfile.open(tmp_path / "k1s.tar.xz") as tar:
        rows = [json.loads(x) for x in tar.extractfile("train/manifest.jsonl").read().splitlines()]
        assert [r["text"] for r in rows] == ["one thing said here", "two things said here"]
        assert all(tar.getmember(f"train/{r['audio']}").isfile() for r in rows)
    # a set packed with no rows unpacks to an empty manifest (run_gpu.sh reads every set's)
    assert carried.unpack(tmp_path / "k2.tar.xz", tmp_path / "un2", workers=1) == {"dev": 0, "train": 1}
    assert (tmp_path / "un2/dev/manifest.jsonl").read_text() == ""


def test_real_speech_sets_keep_a_seeded_share_of_a_source(tmp_path: Path) -> None:
    from recipes import real_speech

    sf = pytest.importorskip("soundfile")
    rows = []
    for i in range(24):
        source, split = ("speech_commands", "train") if i < 20 else ("an4", "train" if i < 22 else "dev")
        audio = f"{source}/{i}.wav"
        (tmp_path / "src" / audio).parent.mkdir(parents=True, exist_ok=True)
        sf.write(tmp_path / "src" / audio, np.zeros(1600, dtype=np.float32), 16000)
        rows.append({"audio": audio, "text": f"word {i}", "source": source, "speaker": "s", "split": split,
                     "duration": 0.1})
    (tmp_path / "src/manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept = []
    for run in range(2):
        report = real_speech.prepare(tmp_path / "src", tmp_path / f"out{run}", 0.98, 1, {"speech_commands": 0.5})
        lines = (tmp_path / f"out{run}/train/manifest.jsonl").read_text().splitlines()
        kept.append([json.loads(x)["audio"] for x in lines])
        assert report["realdev"]["clips"] == 2 and report["train"]["clips"] == len(kept[-1])
    assert kept[0] == kept[1]  # the same clips every time
    assert 2 < sum(a.startswith("speech_commands/") for a in kept[0]) < 18
    assert sum(a.startswith("an4/") for a in kept[0]) == 2  # other sources whole


def test_blends_are_seeded() -> None:
    assert kokoro_blends(10, seed=5) == kokoro_blends(10, seed=5) != kokoro_blends(10, seed=6)


def pico_lib() -> Path:
    """The unpacked pico/ folder of `pico.py pack-lib` (STREAMD_PICO_LIB), else skip."""
    lib = Path(os.environ.get("STREAMD_PICO_LIB", "/nonexistent"))
    if not (lib / "lang").is_dir():
        pytest.skip("STREAMD_PICO_LIB is not an unpacked pico/ folder")
    return lib


def test_pico_voices_rate_and_pitch(tmp_path: Path) -> None:
    from recipes.synthetic import pico
    from recipes.synthetic.synth import Job
    from recipes.synthetic.voices import Prosody

    assert [v.id for v in pico.pico_voices()] == ["pico:en-US", "pico:en-GB"]
    lib = pico_lib()
    rows = pico.run_chunk((lib, tmp_path, [
        Job(i, "the rain in spain stays mainly in the plain", Voice("pico", name), Prosody(s, p))
        for i, (name, s, p) in enumerate([("en-US", 0.8, 0.0), ("en-US", 1.2, 0.0),
                                          ("en-US", 1.2, 1.0), ("en-GB", 1.0, 0.0)])]))
    slow, fast, high, gb = (r["duration"] for r in rows)
    assert slow > 1.3 * fast and abs(high - fast) < 0.1 * fast
    assert (tmp_path / rows[2]["audio"]).read_bytes() != (tmp_path / rows[1]["audio"]).read_bytes()
    assert gb > 1.0 and rows[3]["voice"] == "pico:en-GB"


def test_kokoro_run_refuses_a_voice_of_the_wrong_kind(tmp_path: Path) -> None:
    pytest.importorskip("soundfile")
    from recipes.synthetic import kokoro
    from recipes.synthetic.synth import Job
    from recipes.synthetic.voices import Prosody, kokoro_eval_voices

    class Tone:
        def make(self, job: Job) -> np.ndarray:
            return (0.5 * np.sin(np.arange(16000) / 10)).astype(np.float32)

    assert {v.name for v in kokoro_eval_voices()} == RESERVED_KOKORO_VOICES
    train = [Job(0, "a b c", Voice("kokoro", "af_bella"), Prosody(1.0, 0.0))]
    held = [Job(1, "a b c", Voice("kokoro", "bf_alice:0.9+bf_emma:0.1"), Prosody(1.0, 0.0))]
    with pytest.raises(ValueError):
        kokoro.run(Tone(), held, tmp_path / "train")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        kokoro.run(Tone(), train, tmp_path / "eval", reserved=True)  # type: ignore[arg-type]
    assert kokoro.run(Tone(), train, tmp_path / "train")["utterances"] == 1  # type: ignore[arg-type]
    assert kokoro.run(Tone(), held, tmp_path / "eval", reserved=True)["utterances"] == 1  # type: ignore[arg-type]
    assert kokoro.done_indices(tmp_path / "train/manifest.jsonl") == {0}


def test_kokoro_styles_load_only_the_voices_parts(tmp_path: Path) -> None:
    from recipes.synthetic.kokoro import load_styles

    for name in ("af_bella", "bm_george"):
        np.full((510, 1, 256), 1.0, np.float32).tofile(tmp_path / f"{name}.bin")
    styles = load_styles(tmp_path, [Voice("kokoro", "af_bella:0.5+bm_george:0.5"), Voice("kokoro", "af_bella")])
    assert sorted(styles) == ["af_bella", "bm_george"] and styles["af_bella"].shape == (510, 1, 256)
    with pytest.raises(FileNotFoundError):
        load_styles(tmp_path, [Voice("kokoro", "af_nicole")])
