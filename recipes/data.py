"""Training data: synth.py manifests, WAV reading (stdlib `wave`), duration-bucketed batches.

A batch sampler yields endless batches (epoch after epoch, each a fresh seeded order), tagged
with (epoch, position) so the trainer knows exactly where it is and can restart there.
"""
from __future__ import annotations

import json
import random
import shutil
import wave
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from recipes.wer import normalize

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class Utterance:
    audio: str  # absolute path
    text: str  # normalised
    voice: str
    duration: float  # seconds


def read_manifest(path: str | Path, limit: int | None = None) -> list[Utterance]:
    """synth.py's manifest.jsonl; `audio` is relative to the manifest's folder."""
    root = Path(path).resolve().parent
    out = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            audio = Path(row["audio"])
            out.append(Utterance(str(audio if audio.is_absolute() else root / audio),
                                 normalize(row["text"]), str(row.get("voice", "")),
                                 float(row["duration"])))
            if limit is not None and len(out) >= limit:
                break
    return out


def read_pcm16(path: str | Path) -> np.ndarray:
    """A 16 kHz 16-bit PCM WAV as int16 mono samples."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2 or w.getframerate() != SAMPLE_RATE:
            raise ValueError(f"{path}: need 16-bit PCM at {SAMPLE_RATE} Hz")
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        ch = w.getnchannels()
    if ch > 1:
        pcm = pcm.reshape(-1, ch).mean(axis=1).round().astype(np.int16)
    return pcm


def read_float(path: str | Path) -> np.ndarray:
    """A WAV file as float32 in [-1, 1]."""
    return read_pcm16(path).astype(np.float32) / 32768.0


@dataclass
class Batch:
    audio: Tensor  # (B, N) int16, zero padded
    lengths: Tensor  # (B,) samples
    labels: Tensor  # (B, U) int64, padded with 0
    label_lengths: Tensor  # (B,)
    epoch: int
    position: int  # index of this batch within its epoch

    def pin_memory(self) -> Batch:  # called by the DataLoader's pinning thread
        return Batch(self.audio.pin_memory(), self.lengths.pin_memory(), self.labels.pin_memory(),
                     self.label_lengths.pin_memory(), self.epoch, self.position)

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(self.audio.to(device, non_blocking=nb), self.lengths.to(device, non_blocking=nb),
                     self.labels.to(device, non_blocking=nb), self.label_lengths.to(device, non_blocking=nb),
                     self.epoch, self.position)


class SpeechDataset(Dataset):
    """Item key: (index, epoch, position); returns (int16 audio, label ids, epoch, position)."""

    def __init__(self, utts: Sequence[Utterance], labels: Sequence[Sequence[int]]) -> None:
        self.utts, self.labels = list(utts), [list(x) for x in labels]

    def __len__(self) -> int:
        return len(self.utts)

    def __getitem__(self, key: tuple[int, int, int]) -> tuple[Tensor, Tensor, int, int]:
        i, epoch, pos = key
        audio = torch.from_numpy(read_pcm16(self.utts[i].audio).copy())
        return audio, torch.tensor(self.labels[i], dtype=torch.long), epoch, pos


def collate(items: list[tuple[Tensor, Tensor, int, int]]) -> Batch:
    n = max(a.shape[0] for a, _, _, _ in items)
    u = max(max(lab.shape[0] for _, lab, _, _ in items), 1)
    audio = torch.zeros(len(items), n, dtype=torch.int16)
    labels = torch.zeros(len(items), u, dtype=torch.long)
    for k, (a, lab, _, _) in enumerate(items):
        audio[k, : a.shape[0]] = a
        labels[k, : lab.shape[0]] = lab
    return Batch(audio, torch.tensor([a.shape[0] for a, _, _, _ in items]), labels,
                 torch.tensor([lab.shape[0] for _, lab, _, _ in items]), items[0][2], items[0][3])


class DurationBatchSampler:
    """Endless batches whose padded size (longest x count) stays under `batch_seconds`.

    Each epoch sorts utterances by duration jittered +-10 % (so batches differ between epochs),
    cuts batches greedily, then shuffles the batch order; all from `seed` and the epoch number.
    Starts at (start_epoch, start_position)."""

    def __init__(self, durations: Sequence[float], batch_seconds: float, seed: int,
                 max_batch: int = 1024, start_epoch: int = 0, start_position: int = 0) -> None:
        self.durations = list(durations)
        self.batch_seconds, self.seed, self.max_batch = batch_seconds, seed, max_batch
        self.start_epoch, self.start_position = start_epoch, start_position

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        rng = random.Random(self.seed * 1_000_003 + epoch)
        keyed = sorted(range(len(self.durations)),
                       key=lambda i: self.durations[i] * rng.uniform(0.9, 1.1))
        batches: list[list[int]] = []
        cur: list[int] = []
        longest = 0.0
        for i in keyed:
            d = self.durations[i]
            if cur and (max(longest, d) * (len(cur) + 1) > self.batch_seconds or len(cur) >= self.max_batch):
                batches.append(cur)
                cur, longest = [], 0.0
            cur.append(i)
            longest = max(longest, d)
        if cur:
            batches.append(cur)
        rng.shuffle(batches)
        return batches

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        epoch, pos = self.start_epoch, self.start_position
        while True:
            batches = self.epoch_batches(epoch)
            for p in range(pos, len(batches)):
                yield [(i, epoch, p) for i in batches[p]]
            epoch, pos = epoch + 1, 0


def shm_free_bytes() -> int:
    """Free space of /dev/shm, through which DataLoader workers hand over batches."""
    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:
        return 0


def make_loader(dataset: SpeechDataset, sampler: DurationBatchSampler, workers: int,
                pin_memory: bool) -> DataLoader:
    """Its own generator: making an iterator must not draw from the global RNG (dropout's), or a
    resumed run would diverge from an uninterrupted one."""
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=workers,
                      pin_memory=pin_memory, prefetch_factor=2 if workers > 0 else None,
                      generator=torch.Generator().manual_seed(sampler.seed))


def pad_float(audios: Sequence[np.ndarray]) -> tuple[Tensor, Tensor]:
    """float32 arrays -> (B, N) zero-padded tensor and (B,) lengths."""
    n = max(a.shape[0] for a in audios)
    out = torch.zeros(len(audios), n)
    for k, a in enumerate(audios):
        out[k, : a.shape[0]] = torch.from_numpy(np.asarray(a, dtype=np.float32))
    return out, torch.tensor([a.shape[0] for a in audios])
