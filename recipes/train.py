"""Train a streamd model (cache-aware FastConformer RNN-T + auxiliary CTC) on synth.py manifests.

    python -m recipes.train --train-manifest T/manifest.jsonl --dev-manifest D/manifest.jsonl \\
        --tokenizer tok.model --out OUT --minutes 8 --max-steps 6000 [--resume OUT/last.pt]

Each step: read a duration-bucketed batch (DataLoader workers read the WAVs), augment the
waveforms on the device (recipes.synthetic.augment), log-mel in fp32 (`model.preprocessor`),
SpecAugment, pick one of the model's attention contexts uniformly (the offline forward under that
chunked mask is what streaming computes), encoder in fp32 (bf16 autocast with --bf16), then RNN-T loss
(fp32 logits) + ctc_weight x CTC loss, AdamW, warmup then cosine (or Noam) learning rate.
All per-step randomness (augmentation, masks, context) is seeded by (seed, step), and the batch
order by (seed, epoch), so a resumed run continues the same run.

OUT holds: last.pt (full training state; moments compressed per --moments, split per --chunk-mb),
default-model.pt (the best model by dev WER, streamd format, fp32), summary.json (progress,
dev-WER history, sha256 of the saved files), train.log. Dev WER: offline greedy decoding on
the first --dev-utts of the dev manifest (training voices), mean over --dev-contexts. With
--ema D an exponential moving average of the weights (decay D a step) is kept beside them and
evaluated too; whichever has the lower dev WER is the one exported.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from recipes.data import (
    Batch,
    DurationBatchSampler,
    SpeechDataset,
    make_loader,
    read_float,
    read_manifest,
    shm_free_bytes,
)
from recipes.evaluate import offline_transcribe
from recipes.model_setup import (
    MAX_CHECKPOINT_BYTES,
    TOKENIZER_VOCAB,
    add_dropout,
    build_dims,
    count_params,
    deepen,
    spec_augment,
    train_tokenizer,
    vtlp,
)
from recipes.rnnt_loss import HAVE_TORCHAUDIO, rnnt_loss
from recipes.state import (
    MOMENT_FORMATS,
    file_digest,
    load_object,
    pack_optimizer,
    save_object,
    unpack_optimizer,
    write_file_bytes,
)
from recipes.synthetic.augment import AugmentConfig, augment, nonspeech, valid_mask
from recipes.wer import wer
from streamd.model.tokenizer import Tokenizer
from streamd.model.checkpoint import load_model, save_streamd
from streamd.model.dims import ModelDims
from streamd.model.transducer import Transducer

STATE_FORMAT = "streamd-train/1"


@dataclass
class Progress:
    step: int = 0
    epoch: int = 0
    position: int = 0  # next batch of `epoch` to train on
    best_wer: float = float("inf")
    best_step: int = -1
    train_seconds: float = 0.0
    audio_seconds: float = 0.0  # before augmentation
    skipped: int = 0  # steps with a non-finite loss or gradient
    calls: int = 0  # train.py runs that contributed
    history: list[dict[str, Any]] = field(default_factory=list)


class StepProfile:
    """`--profile-steps N`: the N steps from the 20th of this run on (the loader and the kernels
    warm) under torch.profiler; then one log line of wall, host and device time a step and the
    ops that took most of each: whether the steps are bound by the GPU, by the host launching
    many small ops, or by the loader."""

    START = 20

    def __init__(self, steps: int, device: torch.device, log: Callable[[str], None]) -> None:
        self.steps, self.device, self.log = steps, device, log
        self._prof: torch.profiler.profile | None = None
        self._t0 = 0.0

    def before(self, step: int) -> None:
        """Called before each step of this run (`step` counts from 0)."""
        if not self.steps:
            return
        if step == self.START:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=activities)
            self._prof.start()
            self._t0 = time.monotonic()
        elif step == self.START + self.steps and self._prof is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            wall = (time.monotonic() - self._t0) / self.steps
            self._prof.stop()
            self._report(wall)
            self._prof = None

    def _report(self, wall: float) -> None:
        assert self._prof is not None
        ops = self._prof.key_averages()
        n = self.steps
        host = sum(e.self_cpu_time_total for e in ops) / 1e6 / n
        calls = sum(e.count for e in ops) / n
        top_host = sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:6]
        line = (f"profile of {n} steps: {1e3 * wall:.1f} ms a step wall, {1e3 * host:.1f} ms of host op time "
                f"({calls:.0f} op calls a step); host: "
                + ", ".join(f"{e.key} {e.self_cpu_time_total / 1e3 / n:.1f} ms" for e in top_host))
        if self.device.type == "cuda":
            gpu = sum(getattr(e, "self_device_time_total", 0) for e in ops) / 1e6 / n
            top_gpu = sorted(ops, key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True)[:6]
            line += (f"; GPU busy {1e3 * gpu:.1f} ms a step ({100 * gpu / wall:.0f} % of the wall): "
                     + ", ".join(f"{e.key} {getattr(e, 'self_device_time_total', 0) / 1e3 / n:.1f} ms"
                                 for e in top_gpu))
        self.log(line)


class WeightAverage:
    """An exponential moving average of a model's floating-point weights and buffers (fp32, on
    the model's device), updated after every optimizer step; `swapped_in` puts it in the model
    (to evaluate or export it) and the trained weights back after."""

    def __init__(self, model: Transducer, decay: float, saved: dict[str, Tensor] | None = None) -> None:
        self.decay = decay
        floats = {k: t for k, t in model.state_dict().items() if t.is_floating_point()}  # views of the model's
        self.names, self.live = list(floats), list(floats.values())
        self.avg = [saved[k].to(t.device, torch.float32) if saved is not None else t.float().clone()
                    for k, t in floats.items()]

    @torch.no_grad()
    def update(self) -> None:
        torch._foreach_lerp_(self.avg, [t.float() for t in self.live], 1.0 - self.decay)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        kept = [t.clone() for t in self.live]
        with torch.no_grad():
            for t, a in zip(self.live, self.avg):
                t.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for t, k in zip(self.live, kept):
                    t.copy_(k)

    def state(self) -> dict[str, Tensor]:
        """The average for last.pt, in fp16 (a resumed average starts from it rounded: the
        rounding fades at the decay's rate)."""
        return {k: a.half().cpu() for k, a in zip(self.names, self.avg)}


class Log:
    """Lines to stdout and appended to a file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path

    def __call__(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    a = ap.add_argument
    a("--train-manifest", type=Path, required=True)
    a("--dev-manifest", type=Path, required=True)
    a("--tokenizer", type=Path, required=True, help="SentencePiece model; trained here (BPE) if missing")
    a("--resume", type=Path, help="last.pt (whole, or last.pt.000... parts) to continue from")
    a("--init-from", type=Path, help="a streamd model file: start from its weights, dims and tokenizer "
                                     "with a fresh optimizer and schedule (e.g. the shipped model)")
    a("--deepen", type=int, help="with --init-from: grow the encoder to this many layers, computing the "
                                 "same function at the start (model_setup.deepen)")
    a("--out", type=Path, required=True)
    a("--minutes", type=float, help="wall-clock budget of this run; it stops, evaluates and saves within it")
    a("--max-steps", type=int, default=6000, help="end of training and of the cosine schedule")
    a("--run-steps", type=int, help="stop this run after this many steps (the schedule still ends at --max-steps)")
    a("--batch-seconds", type=float, default=800.0, help="padded audio seconds per batch")
    a("--max-batch", type=int, default=1024, help="utterances per batch at most")
    a("--max-duration", type=float, default=20.0, help="skip longer training utterances")
    a("--lr", type=float, default=1.5e-3, help="peak learning rate")
    a("--warmup", type=int, default=1500)
    a("--schedule", choices=("cosine", "noam"), default="cosine")
    a("--min-lr-ratio", type=float, default=0.01, help="cosine floor, as a fraction of --lr")
    a("--weight-decay", type=float, default=1e-3)
    a("--clip", type=float, default=1.0)
    a("--ctc-weight", type=float, default=0.5)
    a("--dropout", type=float, default=0.1)
    a("--ema", type=float, default=0.0, help="keep and evaluate a moving average of the weights with this "
                                             "decay a step (e.g. 0.999; 0: none)")
    a("--dither", type=float, default=1e-5, help="white noise added to the waveform, as NeMo trains")
    a("--nonspeech", type=float, default=0.05,
      help="share of utterances replaced by non-speech (silence, noise, hum, tones) with an empty transcript")
    a("--vtlp", type=float, default=0.0,
      help="share of utterances whose formants move by a factor of 0.9-1.1 (vocal tract length perturbation)")
    a("--no-augment", action="store_true", help="no waveform augmentation")
    a("--no-specaug", action="store_true")
    a("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a("--bf16", action="store_true", help="bf16 autocast for the encoder (CUDA)")
    a("--seed", type=int, default=0)
    a("--workers", type=int, default=min(8, os.cpu_count() or 1))
    a("--size", choices=("tiny", "default"), default="default")
    a("--vocab", type=int, help="tokenizer vocabulary when training one (default: 256; tiny 64)")
    a("--dev-utts", type=int, default=400)
    a("--dev-contexts", default="13,0", help="right contexts whose mean dev WER picks the best model")
    a("--dev-batch", type=int, default=200)
    a("--eval-minutes", type=float, default=3.0, help="dev eval + save every this often")
    a("--eval-every", type=int, help="also every this many steps")
    a("--log-every", type=int, default=50)
    a("--profile-steps", type=int, default=0,
      help="profile this many steps (torch.profiler, from the 20th of this run on) and log where their time went")
    a("--moments", choices=MOMENT_FORMATS, default="q8", help="how last.pt stores AdamW's moments")
    a("--chunk-mb", type=float, help="split last.pt and default-model.pt into parts of this many MiB")
    a("--log", type=Path, help="log file (default OUT/train.log; appended)")
    a("--name", default="streamd-default", help="model name prefix in default-model.pt")
    return ap.parse_args(argv)


# -- optimisation -----------------------------------------------------------------------------
def make_optimizer(model: Transducer, lr: float, weight_decay: float) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": other, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98))


def lr_at(step: int, peak: float, warmup: int, max_steps: int, schedule: str, min_ratio: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "noam":
        return peak * math.sqrt(warmup / (step + 1))
    progress = min((step - warmup) / max(max_steps - warmup, 1), 1.0)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def step_generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + step)


def pick_context(model: Transducer, seed: int, step: int) -> tuple[int, int]:
    contexts = model.dims.att_context_sizes
    return contexts[random.Random(seed * 1_000_003 + step).randrange(len(contexts))]


def masked_sum(x: Tensor, lengths: Tensor) -> Tensor:
    """Sum of (N, T) over each row's first `lengths` (N,) frames."""
    return (x * valid_mask(lengths, x.shape[1])).sum()


def compute_losses(model: Transducer, batch: Batch, context: tuple[int, int], gen: torch.Generator,
                   use_augment: bool = True, use_specaug: bool = True, bf16: bool = False,
                   ctc_weight: float = 0.5, dither: float = 1e-5, nonspeech_share: float = 0.0,
                   vtlp_share: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """(loss, rnnt, ctc) of a batch already on the model's device; rnnt and ctc are batch means.

    `nonspeech_share` of the rows (chosen by `gen`) become non-speech with an empty transcript,
    after augmentation (whose babble noise would put speech into them); `vtlp_share` of the
    rows get their formants moved (`model_setup.vtlp`) before SpecAugment."""
    dev = model.device
    wav = batch.audio.float() / 32768.0
    lengths = batch.lengths
    label_len = batch.label_lengths
    if use_augment:
        wav, lengths = augment(wav, lengths, gen, AugmentConfig())
    if nonspeech_share > 0:
        quiet = torch.rand(wav.shape[0], generator=gen, device=wav.device) < nonspeech_share
        wav = nonspeech(wav, lengths, quiet, gen)
        label_len = torch.where(quiet, torch.zeros_like(label_len), label_len)
    if dither > 0:  # NeMo's training-time dither: no exactly silent (constant log-floor) frames
        noise = torch.randn(wav.shape, generator=gen, device=wav.device) * dither
        wav = wav + noise * valid_mask(lengths, wav.shape[1])
    mel, mel_len = model.preprocessor(wav, lengths)
    if vtlp_share > 0:
        mel = vtlp(mel, gen, model.dims.features, vtlp_share)
    if use_specaug:
        mel = spec_augment(mel, mel_len, gen)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16 and dev.type == "cuda"):
        enc, enc_len = model.encoder(mel, mel_len, context)
    enc = enc.float()
    labels, blank, n = batch.labels, model.dims.blank_id, batch.labels.shape[0]
    f = model.joint.project_encoder(enc)
    g = model.joint.project_predictor(model.decoder.teacher_forced(labels))  # (B, U+1, H)
    talk, quiet = (label_len > 0).nonzero().squeeze(1), (label_len == 0).nonzero().squeeze(1)
    rnnt = f.new_zeros(())
    if talk.numel():  # the fused loss over the rows with words, trimmed to their longest
        t, u = int(enc_len[talk].max()), int(label_len[talk].max())
        logits = model.joint.joint_after_projection(f[talk, :t, None], g[talk, None, : u + 1])
        rnnt = rnnt + rnnt_loss(logits, labels[talk, :u], enc_len[talk], label_len[talk], blank, "sum")
    if quiet.numel():  # an empty transcript: blank at every frame from the start state
        start = model.joint.joint_after_projection(f[quiet, :, None], g[quiet, None, :1])[:, :, 0]
        rnnt = rnnt - masked_sum(start.log_softmax(-1)[..., blank], enc_len[quiet])
    rnnt = rnnt / n
    if model.ctc_decoder is None or ctc_weight == 0:
        return rnnt, rnnt, torch.zeros_like(rnnt)
    log_probs = model.ctc_decoder(enc)
    ctc = log_probs.new_zeros(())
    if talk.numel():
        ctc = ctc + F.ctc_loss(log_probs[talk].transpose(0, 1), labels[talk], enc_len[talk], label_len[talk],
                               blank=blank, reduction="sum", zero_infinity=True)
    if quiet.numel():
        ctc = ctc - masked_sum(log_probs[quiet, :, blank], enc_len[quiet])
    ctc = ctc / n
    return rnnt + ctc_weight * ctc, rnnt, ctc


# -- state ------------------------------------------------------------------------------------
def training_state(model: Transducer, opt: torch.optim.Optimizer, tokenizer: Tokenizer,
                   progress: Progress, args: dict[str, Any], moments: str,
                   average: WeightAverage | None = None) -> dict[str, Any]:
    rng: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if model.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(model.device)
    return {"format": STATE_FORMAT, "dims": model.dims.to_dict(),
            "model": {k: v.detach().float().cpu() if v.is_floating_point() else v.cpu()
                      for k, v in model.state_dict().items()},
            "tokenizer": tokenizer.model_proto, "optimizer": pack_optimizer(opt.state_dict(), moments),
            "progress": asdict(progress), "rng": rng, "args": args,
            **({"average": average.state()} if average is not None else {})}


def restore(blob: dict[str, Any], model: Transducer, opt: torch.optim.Optimizer) -> Progress:
    """Load weights, optimizer state and RNG into already built objects; return the progress."""
    if blob.get("format") != STATE_FORMAT:
        raise ValueError(f"not a {STATE_FORMAT} training state")
    model.load_state_dict(blob["model"])
    opt.load_state_dict(unpack_optimizer(blob["optimizer"]))
    torch.set_rng_state(blob["rng"]["cpu"])
    if "cuda" in blob["rng"] and model.device.type == "cuda":
        torch.cuda.set_rng_state(blob["rng"]["cuda"], model.device)
    return Progress(**blob["progress"])


def read_summary(folder: Path) -> dict[str, Any]:
    p = folder / "summary.json"
    return json.loads(p.read_text()) if p.exists() else {}


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def export_model(path: Path, model: Transducer, tokenizer: Tokenizer, name: str,
                 chunk_bytes: int | None) -> str:
    """save_streamd (fp32), optionally split; returns the sha256 of the whole file."""
    tmp = path.with_name(path.name + ".export")
    save_streamd(tmp, model, tokenizer, name)
    data = tmp.read_bytes()
    tmp.unlink()
    write_file_bytes(path, data, chunk_bytes)
    return file_digest(data)


# -- evaluation -------------------------------------------------------------------------------
def dev_wer(model: Transducer, tokenizer: Tokenizer, refs: list[str], audios: list[Any],
            rights: list[int], batch: int) -> dict[str, float]:
    was_training = model.training
    model.eval()
    left = model.dims.att_context_sizes[0][0]
    out = {}
    for r in rights:
        hyps = offline_transcribe(model, audios, batch, (left, r))
        out[f"R{r}"] = wer(zip(refs, (tokenizer.decode(h) for h in hyps)))
    out["wer"] = sum(out[f"R{r}"] for r in rights) / len(rights)
    model.train(was_training)
    return out


# -- main -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> Progress:
    args = parse_args(argv)
    t_start = time.monotonic()
    deadline = t_start + args.minutes * 60 if args.minutes else math.inf
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    log = Log(args.log or out / "train.log")
    log("train.py " + " ".join(sys.argv[1:] if argv is None else argv))
    device = torch.device(args.device)
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(args.seed)
    chunk = int(args.chunk_mb * 2**20) if args.chunk_mb else None

    train_utts = [u for u in read_manifest(args.train_manifest) if u.text and u.duration <= args.max_duration]
    dev_utts = [u for u in read_manifest(args.dev_manifest) if u.text][: args.dev_utts]
    log(f"train: {len(train_utts)} utterances, {sum(u.duration for u in train_utts) / 3600:.2f} h; "
        f"dev subset: {len(dev_utts)}")

    blob = None
    model: Transducer | None = None  # built here only when it starts from a model file
    if args.resume:
        sha = read_summary(args.resume.parent).get("files", {}).get(args.resume.name)
        blob = load_object(args.resume, sha)
        tokenizer = Tokenizer(bytes(blob["tokenizer"]))
        dims = ModelDims.from_dict(blob["dims"])
        if not args.tokenizer.exists():
            args.tokenizer.parent.mkdir(parents=True, exist_ok=True)
            args.tokenizer.write_bytes(tokenizer.model_proto)
        log(f"resuming from {args.resume} (step {blob['progress']['step']}); model dims and tokenizer from it")
    elif args.init_from:
        init = load_model(args.init_from)
        model, tokenizer = init.model, init.tokenizer
        if args.deepen:
            model = deepen(model, args.deepen)
            log(f"deepened the encoder from {init.model.dims.n_layers} to {args.deepen} layers")
        dims = model.dims
        args.tokenizer.parent.mkdir(parents=True, exist_ok=True)
        args.tokenizer.write_bytes(tokenizer.model_proto)
        log(f"starting from the weights of {args.init_from} ({init.name}); fresh optimizer")
    else:
        if args.tokenizer.exists():
            tokenizer = Tokenizer(args.tokenizer.read_bytes())
        else:
            vocab = args.vocab or TOKENIZER_VOCAB[args.size]
            tokenizer = train_tokenizer((u.text for u in train_utts), args.tokenizer, vocab)
            log(f"trained a BPE tokenizer: {tokenizer.vocab_size} pieces -> {args.tokenizer}")
        dims = build_dims(args.size, tokenizer.vocab_size)

    model = (model if model is not None else Transducer(dims)).to(device)
    opt = make_optimizer(model, args.lr, args.weight_decay)
    progress = restore(blob, model, opt) if blob is not None else Progress()
    progress.calls += 1
    average = WeightAverage(model, args.ema, blob.get("average") if blob is not None else None) if args.ema else None
    del blob
    model.train()
    add_dropout(model, args.dropout)
    n = count_params(model)
    log(f"model: {n:,} parameters, {n * 4 / 1e6:.1f} MB fp32; vocab {dims.vocab_size}; "
        f"contexts {[list(c) for c in dims.att_context_sizes]}; device {device}; bf16 {args.bf16}; "
        f"rnnt loss: {'torchaudio' if HAVE_TORCHAUDIO else 'pure pytorch'}")
    if args.size == "default" and n * 4 > MAX_CHECKPOINT_BYTES:
        log(f"WARNING: fp32 weights {n * 4 / 1e6:.1f} MB exceed {MAX_CHECKPOINT_BYTES / 1e6:.0f} MB")

    labels = [tokenizer.encode(u.text) for u in train_utts]
    dataset = SpeechDataset(train_utts, labels)
    sampler = DurationBatchSampler([u.duration for u in train_utts], args.batch_seconds, args.seed,
                                   args.max_batch, progress.epoch, progress.position)
    log(f"{len(sampler.epoch_batches(progress.epoch))} batches per epoch; at epoch {progress.epoch}, "
        f"batch {progress.position}, step {progress.step}")
    workers = args.workers
    if workers > 0 and shm_free_bytes() < 2**30:
        log(f"WARNING: /dev/shm has {shm_free_bytes() / 2**20:.0f} MiB free; reading WAVs in this process")
        workers = 0
    loader = make_loader(dataset, sampler, workers, device.type == "cuda")
    dev_refs = [u.text for u in dev_utts]
    dev_audios = [read_float(u.audio) for u in dev_utts]
    rights = [int(r) for r in args.dev_contexts.split(",")]
    saved_args = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    files: dict[str, str] = {}  # sha256 of the whole files this run wrote

    def evaluated() -> dict[str, float]:
        return dev_wer(model, tokenizer, dev_refs, dev_audios, rights, args.dev_batch) if dev_utts else {"wer": math.inf}

    def checkpoint(reason: str) -> float:
        t0 = time.monotonic()
        res = evaluated()
        avg: dict[str, float] = {}
        if average is not None:
            with average.swapped_in():
                avg = evaluated()
        record = {"step": progress.step, "epoch": progress.epoch, **{k: round(v, 3) for k, v in res.items()},
                  **{f"avg_{k}": round(v, 3) for k, v in avg.items()},
                  "train_hours": round(progress.train_seconds / 3600, 4),
                  "audio_hours_seen": round(progress.audio_seconds / 3600, 2), "reason": reason}
        progress.history.append(record)
        use_avg = average is not None and avg["wer"] < res["wer"]
        wer_now = avg["wer"] if use_avg else res["wer"]
        improved = wer_now < progress.best_wer
        if improved:
            progress.best_wer, progress.best_step = wer_now, progress.step
            name = f"{args.name}-step{progress.step}" + ("-avg" if use_avg else "")
            with average.swapped_in() if use_avg and average is not None else nullcontext():
                files["default-model.pt"] = export_model(out / "default-model.pt", model, tokenizer, name, chunk)
        state = training_state(model, opt, tokenizer, progress, saved_args, args.moments, average)
        files["last.pt"] = save_object(state, out / "last.pt", chunk)
        write_json(out / "summary.json", {"files": files, "params": n, "dims": dims.to_dict(),
                                          "progress": asdict(progress)})
        took = time.monotonic() - t0
        log(f"eval step {progress.step}: dev WER {res['wer']:.2f} ("
            + ", ".join(f"{k} {v:.2f}" for k, v in res.items() if k != "wer") + ")"
            + (f"; averaged weights {avg['wer']:.2f} (" + ", ".join(f"{k} {v:.2f}" for k, v in avg.items() if k != "wer")
               + ")" if avg else "")
            + f"; best {progress.best_wer:.2f} at step {progress.best_step}"
            + (f" -> exported default-model.pt{' (averaged)' if use_avg else ''}" if improved else "")
            + f"; saved last.pt ({took:.1f} s)")
        return took

    reserve = 45.0  # seconds kept for the final eval + save, re-measured at every checkpoint
    last_ckpt = time.monotonic()
    win = {"t": time.monotonic(), "steps": 0, "audio": 0.0, "loss": 0.0, "rnnt": 0.0, "ctc": 0.0, "gnorm": 0.0,
           "data": 0.0}
    step_time = 0.0
    profiling = StepProfile(args.profile_steps, device, log)
    stop = "max-steps"
    it = iter(loader)
    first_step = progress.step
    while progress.step < args.max_steps:
        if time.monotonic() + reserve + 2 * step_time > deadline:
            stop = "time budget"
            break
        if args.run_steps is not None and progress.step - first_step >= args.run_steps:
            stop = "run-steps"
            break
        profiling.before(progress.step - first_step)
        t0 = time.monotonic()
        cpu_batch = next(it)
        win["data"] += time.monotonic() - t0  # waiting for the loader
        audio_s = float(cpu_batch.lengths.sum()) / 16000
        batch = cpu_batch.to(device)
        step = progress.step
        gen = step_generator(args.seed, step, device)
        ctx = pick_context(model, args.seed, step)
        loss, rnnt, ctc = compute_losses(model, batch, ctx, gen, not args.no_augment, not args.no_specaug,
                                         args.bf16, args.ctc_weight, args.dither, args.nonspeech,
                                         args.vtlp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        vals = torch.stack([loss.detach(), rnnt.detach(), ctc.detach(), gnorm.detach().float()]).tolist()
        if all(math.isfinite(v) for v in vals):
            lr = lr_at(step, args.lr, args.warmup, args.max_steps, args.schedule, args.min_lr_ratio)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            if average is not None:
                average.update()
            for k, v in zip(("loss", "rnnt", "ctc", "gnorm"), vals):
                win[k] += v
            win["steps"] += 1
        else:
            progress.skipped += 1
            opt.zero_grad(set_to_none=True)
            log(f"step {step}: non-finite loss/gradient {vals}, skipped")
        progress.step += 1
        progress.epoch, progress.position = batch.epoch, batch.position + 1
        progress.audio_seconds += audio_s
        win["audio"] += audio_s
        dt = time.monotonic() - t0
        progress.train_seconds += dt
        step_time = dt if step_time == 0 else 0.9 * step_time + 0.1 * dt
        if progress.step % args.log_every == 0:
            el = time.monotonic() - win["t"]
            ok = max(win["steps"], 1)
            log(f"step {progress.step} ep {progress.epoch} loss {win['loss'] / ok:.3f} rnnt {win['rnnt'] / ok:.3f} "
                f"ctc {win['ctc'] / ok:.3f} gnorm {win['gnorm'] / ok:.2f} lr {opt.param_groups[0]['lr']:.2e} "
                f"{args.log_every / el:.2f} steps/s {win['audio'] / 3600 / el:.3f} audio-h/s "
                f"data wait {100 * win['data'] / el:.0f} % "
                f"batch {batch.audio.shape[0]} ctx {list(ctx)} elapsed {time.monotonic() - t_start:.0f} s")
            win = {"t": time.monotonic(), "steps": 0, "audio": 0.0, "loss": 0.0, "rnnt": 0.0, "ctc": 0.0, "gnorm": 0.0,
                   "data": 0.0}
        due = time.monotonic() - last_ckpt >= args.eval_minutes * 60
        every = bool(args.eval_every) and progress.step % args.eval_every == 0
        if (due or every) and progress.step < args.max_steps:
            took = checkpoint("periodic")
            reserve = max(reserve, 1.5 * took + 10)
            last_ckpt = time.monotonic()
            win["t"] += took  # keep eval time out of steps/s
    del it
    log(f"stopping: {stop}; {time.monotonic() - t_start:.0f} s elapsed")
    if progress.train_seconds > 0 and progress.step < args.max_steps:
        rate = progress.step / progress.train_seconds
        log(f"at {rate:.2f} steps/s overall, --max-steps {args.max_steps} needs "
            f"{(args.max_steps - progress.step) / rate / 60:.1f} more minutes of training")
    checkpoint(f"end ({stop})")
    return progress


if __name__ == "__main__":
    main()
