"""Tests of the training recipe (recipes/train.py and friends), CPU only, tiny model."""
from __future__ import annotations

import itertools
import math
import json
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from recipes import evaluate, ship, soup, state, train
from recipes.synthetic import augment
from recipes.data import Batch, DurationBatchSampler, SpeechDataset, collate, read_manifest
from recipes.model_setup import (
    MAX_CHECKPOINT_BYTES,
    build_dims,
    count_params,
    deepen,
    train_tokenizer,
    vtlp,
)
from recipes.rnnt_loss import HAVE_TORCHAUDIO, rnnt_loss, rnnt_loss_pytorch
from recipes.wer import edit_distance, normalize, wer, word_errors
from streamd.model.checkpoint import load_model, save_streamd
from streamd.model.dims import FeatureDims
from streamd.model.preprocessor import LogMel
from streamd.model.transducer import Transducer

TEXTS = ["a cat sat", "the dog ran far", "we eat it", "a big red box"]


# -- helpers ----------------------------------------------------------------------------------
def brute_force_rnnt(logits: torch.Tensor, y: list[int], blank: int) -> torch.Tensor:
    """-log of the summed probability of every alignment (T blanks and U labels, last a blank)."""
    t_len, u_len = logits.shape[0], len(y)
    lp = logits.double().log_softmax(-1)
    scores = []
    moves = t_len + u_len - 1
    for labels_at in itertools.combinations(range(moves), u_len):
        t = u = 0
        s = lp.new_zeros(())
        for k in range(moves):
            if k in labels_at:
                s = s + lp[t, u, y[u]]
                u += 1
            else:
                s = s + lp[t, u, blank]
                t += 1
        scores.append(s + lp[t_len - 1, u_len, blank])
    return -torch.logsumexp(torch.stack(scores), 0)


def speechlike(text: str, rate: int = 16000) -> np.ndarray:
    """A distinct tone pair per letter, 60 ms each, 100 ms pauses between words."""
    parts = [np.zeros(1600)]
    t = np.arange(int(0.06 * rate)) / rate
    for ch in text:
        if ch == " ":
            parts.append(np.zeros(1600))
        else:
            k = ord(ch) - ord("a")
            parts.append(0.3 * np.sin(2 * np.pi * (300 + 90 * k) * t) + 0.2 * np.sin(2 * np.pi * (2500 - 60 * k) * t))
    parts.append(np.zeros(1600))
    return np.concatenate(parts).astype(np.float32)


def write_corpus(folder: Path, texts: list[str]) -> Path:
    """WAVs + a synth.py-style manifest.jsonl; returns the manifest."""
    (folder / "audio").mkdir(parents=True, exist_ok=True)
    rows = []
    for i, text in enumerate(texts):
        audio = speechlike(text)
        rel = f"audio/{i:03d}.wav"
        with wave.open(str(folder / rel), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes((audio * 32767).round().astype("<i2").tobytes())
        rows.append({"audio": rel, "text": text, "voice": f"espeak-ng:v{i % 2}", "engine": "espeak-ng",
                     "duration": len(audio) / 16000, "speed": 1.0, "pitch": 0.0})
    manifest = folder / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return manifest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"), TEXTS)


def tiny_args(corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["--train-manifest", str(corpus), "--dev-manifest", str(corpus), "--tokenizer", str(out.parent / "tok.model"),
            "--out", str(out), "--size", "tiny", "--device", "cpu", "--workers", "0", "--warmup", "2",
            "--lr", "3e-3", "--batch-seconds", "4", "--dropout", "0.1", "--log-every", "1",
            "--eval-minutes", "1000", "--dev-contexts", "13,0", *extra]


# -- loss -------------------------------------------------------------------------------------
def test_pure_rnnt_loss_equals_brute_force_values_and_gradients() -> None:
    torch.manual_seed(1)
    b, t, u, v = 3, 5, 3, 6
    logits = torch.randn(b, t, u + 1, v + 1, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, v, (b, u))
    t_len, u_len = torch.tensor([5, 3, 4]), torch.tensor([3, 2, 0])
    loss = rnnt_loss_pytorch(logits, targets, t_len, u_len, blank=v, reduction="none")
    ref = torch.stack([brute_force_rnnt(logits[i, : t_len[i], : u_len[i] + 1], targets[i, : u_len[i]].tolist(), v)
                       for i in range(b)])
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)
    (g,) = torch.autograd.grad(loss.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-4, atol=1e-5)
    mean = rnnt_loss(logits.float(), targets, t_len, u_len, blank=v, use_torchaudio=False)
    torch.testing.assert_close(mean.double(), ref.mean(), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAVE_TORCHAUDIO, reason="torchaudio's rnnt_loss is not importable")
def test_pure_rnnt_loss_equals_torchaudio() -> None:
    torch.manual_seed(2)
    logits = torch.randn(4, 9, 5, 11)
    targets = torch.randint(0, 10, (4, 4), dtype=torch.int32)
    t_len, u_len = torch.tensor([9, 7, 9, 2], dtype=torch.int32), torch.tensor([4, 1, 0, 3], dtype=torch.int32)
    ours = rnnt_loss(logits, targets, t_len, u_len, blank=10, reduction="none", use_torchaudio=False)
    theirs = rnnt_loss(logits, targets, t_len, u_len, blank=10, reduction="none", use_torchaudio=True)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


# -- WER, state files -------------------------------------------------------------------------
def test_wer_known_cases() -> None:
    assert normalize("Hello, World!  It's 'quoted' ok-ish") == "hello world it's quoted ok ish"
    assert edit_distance(["a", "b", "c"], ["a", "x", "c", "d"]) == 2
    assert word_errors("the cat sat", "the cat sat") == (0, 3)
    assert word_errors("the cat sat", "cat sat on it") == (3, 3)  # 1 deletion + 2 insertions
    assert word_errors("", "extra words") == (2, 0)
    assert wer([("a b c d", "a b c d"), ("e f", "e g")]) == pytest.approx(100 * 1 / 6)
    assert evaluate.word_errors is word_errors


def test_q8_moments_are_close_and_zeros_exact() -> None:
    torch.manual_seed(3)
    m = torch.sign(torch.randn(3000)) * torch.exp2(-23.9 * torch.rand(3000))  # within the 2^24 range
    m[::5] = 0
    for x, tol in ((m, 0.07), (m.abs(), 0.034)):
        y = state.q8_decode(state.q8_encode(x))
        nz = x != 0
        assert torch.all(y[~nz] == 0)
        assert ((y[nz] - x[nz]) / x[nz]).abs().max() < tol
        assert state.q8_encode(x)["q8"].element_size() == 1
    tiny = torch.tensor([1.0, 1e-12, 0.0])  # below 2^-24 of the block's max: raised, never zeroed
    assert state.q8_decode(state.q8_encode(tiny)).tolist()[1:] == [2.0**-24, 0.0]


def test_split_files_round_trip(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    state.write_file_bytes(tmp_path / "f.pt", data, chunk_bytes=3000)
    assert [p.name for p in state.chunk_paths(tmp_path / "f.pt")] == ["f.pt.000", "f.pt.001", "f.pt.002", "f.pt.003"]
    assert state.read_file_bytes(tmp_path / "f.pt") == data
    state.write_file_bytes(tmp_path / "f.pt", data[:5000], chunk_bytes=3000)  # fewer parts: stale ones go
    assert len(state.chunk_paths(tmp_path / "f.pt")) == 2
    assert state.read_file_bytes(tmp_path / "f.pt") == data[:5000]
    state.write_file_bytes(tmp_path / "f.pt", data)
    assert (tmp_path / "f.pt").exists() and not state.chunk_paths(tmp_path / "f.pt")


# -- model and training -----------------------------------------------------------------------
def test_default_preset_checkpoint_is_under_25_mb(tmp_path: Path) -> None:
    tok = train_tokenizer([" ".join(TEXTS)] * 3 + TEXTS, tmp_path / "tok.model", 32)
    model = Transducer(build_dims("default", tok.vocab_size))
    save_streamd(tmp_path / "m.pt", model, tok, "size-check")
    assert count_params(model) * 4 <= MAX_CHECKPOINT_BYTES
    assert (tmp_path / "m.pt").stat().st_size <= MAX_CHECKPOINT_BYTES


def tiny_model_and_batch(corpus: Path, tmp_path: Path) -> tuple[Transducer, Batch]:
    """A fresh tiny model and the whole corpus as one batch."""
    utts = read_manifest(corpus)
    tok = train_tokenizer([u.text for u in utts], tmp_path / "tok.model", 64)
    ds = SpeechDataset(utts, [tok.encode(u.text) for u in utts])
    return Transducer(build_dims("tiny", tok.vocab_size)), collate([ds[(i, 0, 0)] for i in range(len(utts))])


@pytest.mark.parametrize("n_layers", [3, 4])
def test_deepen_keeps_the_function_and_the_new_layers_learn(n_layers: int) -> None:
    torch.manual_seed(0)
    model = Transducer(build_dims("tiny", 40)).eval()
    with torch.no_grad():  # output norms with a real affine, as a trained model has
        for layer in model.encoder.layers:
            layer.norm_out.weight.normal_(1.0, 0.3)
            layer.norm_out.bias.normal_(0.0, 0.3)
    deeper = deepen(model, n_layers).eval()
    assert deeper.dims.n_layers == n_layers == len(deeper.encoder.layers)
    mel, lengths = torch.randn(2, 80, 120), torch.tensor([120, 90])
    for context in deeper.dims.att_context_sizes:
        want, want_len = model.encoder(mel, lengths, context)
        got, got_len = deeper.encoder(mel, lengths, context)
        assert torch.equal(want_len, got_len)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    got.sum().backward()
    new = deeper.encoder.layers[-1]  # a new layer always follows the last old one
    assert not new.self_attn.linear_out.weight.any() and new.self_attn.linear_out.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError):
        deepen(model, 5)


def test_tiny_training_steps_reduce_the_loss(corpus: Path, tmp_path: Path) -> None:
    model, batch = tiny_model_and_batch(corpus, tmp_path)
    opt = train.make_optimizer(model, 3e-3, 0.0)
    losses = []
    for step in range(30):
        gen = train.step_generator(0, step, torch.device("cpu"))
        loss, rnnt, ctc = train.compute_losses(model, batch, (70, 13), gen, use_augment=False, use_specaug=False)
        assert torch.isfinite(rnnt) and torch.isfinite(ctc)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


def test_augmented_step_runs_on_every_context(corpus: Path, tmp_path: Path) -> None:
    model, batch = tiny_model_and_batch(corpus, tmp_path)
    for step, ctx in enumerate(model.dims.att_context_sizes):
        loss, _, _ = train.compute_losses(model, batch, ctx, train.step_generator(0, step, torch.device("cpu")))
        assert torch.isfinite(loss)


def test_empty_transcripts_score_the_all_blank_path(corpus: Path, tmp_path: Path) -> None:
    """Rows turned into non-speech lose their words: their losses are those of an empty target
    (the lattice's and CTC's own), the rows with words keep theirs, and gradients stay finite."""
    model, batch = tiny_model_and_batch(corpus, tmp_path)
    model.eval()  # no dropout: the same forward twice
    gen = lambda: train.step_generator(0, 0, torch.device("cpu"))  # noqa: E731
    _, rnnt, ctc = train.compute_losses(model, batch, (70, 13), gen(), use_augment=False, use_specaug=False,
                                        dither=0.0, nonspeech_share=0.5)
    # the same rows, chosen by the same generator draw, scored by the reference losses
    quiet = torch.rand(batch.audio.shape[0], generator=gen()) < 0.5
    assert 0 < int(quiet.sum()) < batch.audio.shape[0]
    wav = augment.nonspeech(batch.audio.float() / 32768.0, batch.lengths, quiet, gen_after_rand(quiet))
    mel, mel_len = model.preprocessor(wav, batch.lengths)
    enc, enc_len = model.encoder(mel, mel_len, (70, 13))
    label_len = torch.where(quiet, 0, batch.label_lengths)
    f = model.joint.project_encoder(enc)
    g = model.joint.project_predictor(model.decoder.teacher_forced(batch.labels))
    logits = model.joint.joint_after_projection(f[:, :, None], g[:, None])
    blank = model.dims.blank_id
    want_rnnt = rnnt_loss_pytorch(logits, batch.labels, enc_len, label_len, blank, "mean")
    want_ctc = torch.nn.functional.ctc_loss(model.ctc_decoder(enc).transpose(0, 1), batch.labels, enc_len,
                                            label_len, blank=blank, reduction="sum") / len(quiet)
    assert torch.allclose(rnnt, want_rnnt, rtol=1e-4) and torch.allclose(ctc, want_ctc, rtol=1e-4)
    model.zero_grad()
    (rnnt + ctc).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def gen_after_rand(quiet: torch.Tensor) -> torch.Generator:
    """The step generator as compute_losses has it after drawing which rows go quiet."""
    g = train.step_generator(0, 0, torch.device("cpu"))
    torch.rand(quiet.shape[0], generator=g)
    return g


def test_sampler_resumes_at_its_position() -> None:
    durations = [1.0 + (i % 7) * 0.5 for i in range(50)]
    full = DurationBatchSampler(durations, 6.0, seed=3)
    first = list(itertools.islice(iter(full), 30))
    e, p = first[11][0][1], first[11][0][2]
    resumed = DurationBatchSampler(durations, 6.0, seed=3, start_epoch=e, start_position=p)
    assert list(itertools.islice(iter(resumed), 19)) == first[11:]
    assert all(max(durations[i] for i, _, _ in b) * len(b) <= 6.0 for b in first)


def test_state_save_and_restore_is_identical(corpus: Path, tmp_path: Path) -> None:
    utts = read_manifest(corpus)
    tok = train_tokenizer([u.text for u in utts], tmp_path / "tok.model", 64)
    model = Transducer(build_dims("tiny", tok.vocab_size))
    opt = train.make_optimizer(model, 1e-3, 1e-3)
    ds = SpeechDataset(utts, [tok.encode(u.text) for u in utts])
    batch = collate([ds[(i, 0, 0)] for i in range(len(utts))])
    for step in range(2):
        loss, _, _ = train.compute_losses(model, batch, (70, 0), train.step_generator(0, step, torch.device("cpu")))
        opt.zero_grad()
        loss.backward()
        opt.step()
    progress = train.Progress(step=2, epoch=1, position=3, best_wer=50.0, best_step=2)
    for fmt, tol in (("fp32", 0.0), ("q8", 0.07)):
        sha = state.save_object(train.training_state(model, opt, tok, progress, {}, fmt), tmp_path / f"{fmt}.pt", 20_000)
        blob = state.load_object(tmp_path / f"{fmt}.pt", sha)
        model2 = Transducer(build_dims("tiny", tok.vocab_size))
        opt2 = train.make_optimizer(model2, 1e-3, 1e-3)
        progress2 = train.restore(blob, model2, opt2)
        assert progress2 == progress
        for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
            assert torch.equal(a, b), k
        s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
        assert s1.keys() == s2.keys()
        for k in s1:
            assert torch.equal(s1[k]["step"], s2[k]["step"])
            for name in ("exp_avg", "exp_avg_sq"):
                a, b = s1[k][name], s2[k][name]
                if tol == 0:
                    assert torch.equal(a, b)
                else:
                    big = a.abs() >= a.abs().max() * 2**-24  # smaller ones are raised to that floor
                    assert torch.all(b[a == 0] == 0) and ((b[big] - a[big]) / a[big]).abs().max() < tol
        assert Path(tmp_path / f"{fmt}.pt.000").exists()


def test_two_runs_with_resume_equal_one_run_and_export_loads(corpus: Path, tmp_path: Path) -> None:
    one = tmp_path / "one" / "out"
    train.main(tiny_args(corpus, one, "--max-steps", "6", "--moments", "fp32"))
    two = tmp_path / "two" / "out"
    first = train.main(tiny_args(corpus, two, "--max-steps", "6", "--run-steps", "4", "--moments", "fp32",
                                 "--chunk-mb", "0.2"))
    assert first.step == 4 and (two / "last.pt.000").exists() and (two / "default-model.pt.000").exists()
    # same run continued to 6 steps in another folder, against one run of 6 steps
    resumed = train.main(tiny_args(corpus, tmp_path / "two" / "out2", "--max-steps", "6", "--moments", "fp32",
                                   "--resume", str(two / "last.pt")))
    assert resumed.step == 6 and resumed.calls == 2
    a = state.load_object(tmp_path / "two" / "out2" / "last.pt")
    b = state.load_object(one / "last.pt")
    assert a["progress"]["step"] == b["progress"]["step"] == 6
    for k in ("encoder.layers.0.self_attn.linear_q.weight", "joint.joint_net.2.weight"):
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-5, atol=1e-6)
    summary = json.loads((two / "summary.json").read_text())
    assert summary["progress"]["step"] == 4 and summary["files"]["last.pt"]
    loaded = load_model(one / "default-model.pt")  # the exported best model, streamd format
    assert loaded.model.dims.vocab_size == loaded.tokenizer.vocab_size and loaded.name.startswith("streamd-default-step")
    assert state.load_streamd_any(two / "default-model.pt").model.dims == loaded.model.dims


def test_a_profiled_run_logs_where_its_steps_time_went(corpus: Path, tmp_path: Path) -> None:
    """`--profile-steps N`: N steps from the 20th on under torch.profiler, then one log line of
    wall and host time a step and the ops that took most; every step's log line says how long
    the loop waited for the loader."""
    out = tmp_path / "out"
    train.main(tiny_args(corpus, out, "--max-steps", "24", "--profile-steps", "3"))
    lines = (out / "train.log").read_text().splitlines()
    profile = [line for line in lines if "profile of 3 steps:" in line]
    assert len(profile) == 1 and "ms a step wall" in profile[0] and "op calls a step" in profile[0]
    assert all("data wait" in line for line in lines if " steps/s " in line)


def test_weight_average_updates_swaps_in_and_out_and_survives_last_pt() -> None:
    torch.manual_seed(3)
    model = Transducer(build_dims("tiny", 64))
    average = train.WeightAverage(model, decay=0.75)
    before = {k: t.clone() for k, t in model.state_dict().items()}
    with torch.no_grad():
        for t in model.parameters():
            t.add_(1.0)
    average.update()
    trained = {k: t.clone() for k, t in model.state_dict().items()}
    with average.swapped_in():
        for k, t in model.state_dict().items():
            want = 0.75 * before[k] + 0.25 * trained[k] if t.is_floating_point() else trained[k]
            torch.testing.assert_close(t, want, rtol=0, atol=1e-6)
    for k, t in model.state_dict().items():  # the trained weights are back, exactly
        assert torch.equal(t, trained[k]), k
    again = train.WeightAverage(model, 0.75, average.state())  # as a resumed run restores it (fp16)
    for a, b in zip(again.avg, average.avg):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_a_run_with_a_weight_average_exports_the_better_of_the_two(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    progress = train.main(tiny_args(corpus, out, "--max-steps", "4", "--ema", "0.5", "--moments", "fp32"))
    [end] = progress.history
    assert {"wer", "avg_wer", "avg_R13", "avg_R0"} <= end.keys()
    assert progress.best_wer == min(end["wer"], end["avg_wer"])
    name = load_model(out / "default-model.pt").name
    assert name.endswith("-avg") == (end["avg_wer"] < end["wer"]), (name, end)
    saved = state.load_object(out / "last.pt")
    assert saved["average"].keys() <= saved["model"].keys() and len(saved["average"]) > 0
    resumed = train.main(tiny_args(corpus, tmp_path / "out2", "--max-steps", "5", "--ema", "0.5",
                                   "--resume", str(out / "last.pt")))
    assert resumed.step == 5 and "avg_wer" in resumed.history[-1]


def test_init_from_a_model_starts_a_fresh_run_from_its_weights(corpus: Path, tmp_path: Path) -> None:
    first = tmp_path / "first"
    train.main(tiny_args(corpus, first, "--max-steps", "2"))
    shipped = load_model(first / "default-model.pt")
    second = tmp_path / "second"
    progress = train.main(tiny_args(corpus, second, "--max-steps", "1", "--init-from", str(first / "default-model.pt"),
                                    "--tokenizer", str(tmp_path / "second-tok.model")))
    assert progress.step == 1 and progress.calls == 1
    blob = state.load_object(second / "last.pt")
    assert bytes(blob["tokenizer"]) == shipped.tokenizer.model_proto
    moved = [k for k, v in shipped.model.state_dict().items()
             if v.is_floating_point() and not torch.equal(v, blob["model"][k])]
    assert moved  # one step from the shipped weights, not from a fresh initialisation:
    k = "encoder.layers.0.self_attn.linear_q.weight"
    assert (blob["model"][k] - shipped.model.state_dict()[k]).abs().max() < 0.01


def test_evaluate_streaming_matches_offline(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    train.main(tiny_args(corpus, out, "--max-steps", "3"))
    results = evaluate.main(["--model", str(out / "default-model.pt"), "--manifest", f"reserved={corpus}",
                             "--manifest", f"train-voices={corpus}", "--device", "cpu", "--contexts", "13,0",
                             "--batch", "3", "--out", str(tmp_path / "eval")])
    for r in ("R13", "R0"):
        res = results["reserved"][r]
        assert set(res["streaming"]["per_voice"]) == {"espeak-ng:v0", "espeak-ng:v1"}
        assert res["streaming"]["errors"] == res["offline"]["errors"]  # streaming = offline, chunk for chunk
    md = (tmp_path / "eval" / "eval.md").read_text()
    assert "| reserved (4 utts) | streaming |" in md and "espeak-ng:v1" in md
    pooled = 100 * sum(results[s]["R0"]["streaming"]["errors"] for s in ("reserved", "train-voices")) / sum(
        results[s]["R0"]["streaming"]["words"] for s in ("reserved", "train-voices"))
    assert evaluate.pooled_wer(results, "R0", "streaming") == pytest.approx(pooled)
    assert "| all 2 sets pooled (8 utts) | streaming |" in md
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["results"]["train-voices"]["utterances"] == 4


def test_streaming_tokens_equal_offline_tokens_on_a_random_model() -> None:
    torch.manual_seed(0)
    model = Transducer(build_dims("tiny", 40)).eval()
    audios = [speechlike(t) for t in TEXTS]
    for r in (13, 0):
        streamed = evaluate.stream_transcribe(model, audios, r, batch=3)
        offline = evaluate.offline_transcribe(model, audios, batch=3, context=(70, r))
        assert streamed == offline and all(streamed)


def test_ship_stores_fp16_weights_that_load_as_the_same_model(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    train.main(tiny_args(corpus, out, "--max-steps", "2"))
    shipped = tmp_path / "assets" / "default-model.pt"
    ship.main([str(out / "default-model.pt"), "--out", str(shipped), "--name", "shipped-test"])
    src, got = load_model(out / "default-model.pt"), load_model(shipped)
    assert got.name == "shipped-test" and got.tokenizer.model_proto == src.tokenizer.model_proto
    assert shipped.stat().st_size < 0.7 * (out / "default-model.pt").stat().st_size
    stored = torch.load(shipped, weights_only=True)["state_dict"]
    for k, v in src.model.state_dict().items():
        if v.is_floating_point():
            assert stored[k].dtype == torch.float16
            assert torch.equal(got.model.state_dict()[k], v.half().float())  # loaded back as fp32


def test_soup_averages_the_weights_of_models_of_one_tokenizer(corpus: Path, tmp_path: Path) -> None:
    tok = train_tokenizer(TEXTS * 3, tmp_path / "tok.model", 40)
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        paths.append(tmp_path / f"m{seed}.pt")
        save_streamd(paths[-1], Transducer(build_dims("tiny", tok.vocab_size)), tok, f"m{seed}")
    a, b = (load_model(p).model.state_dict() for p in paths)
    soup.main([str(tmp_path / "soup.pt"), *map(str, paths), "--weights", "3,1"])
    got = load_model(tmp_path / "soup.pt")
    assert got.name == "m0-soup" and got.tokenizer.model_proto == tok.model_proto
    for k, v in got.model.state_dict().items():
        expect = (3 * a[k] + b[k]) / 4 if v.is_floating_point() else a[k]
        assert torch.allclose(v, expect, atol=1e-6), k
    other = train_tokenizer(TEXTS[::-1] * 2 + ["zebra quiz"] * 3, tmp_path / "other.model", 40)
    save_streamd(tmp_path / "other.pt", Transducer(build_dims("tiny", other.vocab_size)), other, "other")
    assert other.model_proto != tok.model_proto and other.vocab_size == tok.vocab_size
    with pytest.raises(SystemExit, match="tokenizer differs"):
        soup.main([str(tmp_path / "bad.pt"), str(paths[0]), str(tmp_path / "other.pt")])
    with pytest.raises(SystemExit, match="one non-negative weight per model"):
        soup.main([str(tmp_path / "bad.pt"), *map(str, paths), "--weights", "1"])
    assert not (tmp_path / "bad.pt").exists()


def test_nonspeech_clips_are_labelled_by_kind() -> None:
    audios, kinds = evaluate.nonspeech_clips(40)
    assert "silence" in kinds and len(set(kinds)) >= 5
    assert all(bool((a == 0).all()) == (k == "silence") for a, k in zip(audios, kinds))
    assert all(2 * 16000 <= len(a) <= 10 * 16000 for a in audios)


def test_vtlp_moves_formants_and_leaves_other_rows_alone() -> None:
    """A 2 kHz tone: stretched by 1.1 its peak moves up the mel bins, by 0.9 down; rows not
    chosen, and a factor of 1, are unchanged."""
    dims = FeatureDims()
    t = torch.arange(16000) / 16000
    mel, _ = LogMel(dims)(torch.sin(2 * math.pi * 2000 * t)[None].repeat(2, 1), torch.tensor([16000, 16000]))
    peak = int(mel[0, :, 50].argmax())
    gen = torch.Generator().manual_seed(0)
    assert int(vtlp(mel, gen, dims, 1.0, (1.1, 1.1))[0, :, 50].argmax()) > peak
    assert int(vtlp(mel, gen, dims, 1.0, (0.9, 0.9))[0, :, 50].argmax()) < peak
    assert torch.equal(vtlp(mel, gen, dims, 0.0), mel)
    assert torch.allclose(vtlp(mel, gen, dims, 1.0, (1.0, 1.0)), mel)


def test_an_augmented_step_with_vtlp_is_finite(corpus: Path, tmp_path: Path) -> None:
    model, batch = tiny_model_and_batch(corpus, tmp_path)
    loss, _, _ = train.compute_losses(model, batch, model.dims.att_context_sizes[0],
                                      train.step_generator(0, 0, torch.device("cpu")), vtlp_share=0.5)
    assert torch.isfinite(loss)
