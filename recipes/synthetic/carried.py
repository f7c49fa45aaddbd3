"""Speech made on this machine and carried to the GPU machine as compressed audio (Ogg/Opus).

    python -m recipes.synthetic.carried pack --out .carry/kokoro.tar.xz --max-mib 15 \\
        --held-apart .carry/text/dev.txt .carry/text/eval.txt .carry/kokoro/train .carry/kokoro/dev
    python -m recipes.synthetic.carried pack --out .carry/kokoro2.tar.xz --not-in .carry/kokoro.tar.xz ...
    python -m recipes.synthetic.carried unpack --pack .carry/kokoro.tar.xz --out WORK/kokoro
    python -m recipes.synthetic.carried merge --out M.jsonl A/manifest.jsonl 'B/manifest.jsonl*3'
    python -m recipes.synthetic.carried encode --src SYNTH_OUT --out .carry/classic/train
    python -m recipes.synthetic.carried join --out .carry/kokoro/train .carry/kokoro/train-a .carry/kokoro/train-b
    python -m recipes.synthetic.carried shrink --pack .carry/kokoro.tar.xz --out SMALL.tar.xz --rows 6

encode: a set synthesised here (synth.py's WAVs) as Ogg/Opus in a set folder that pack takes, so
that the classic engines' speech can travel without the engines.

pack: the finished utterances of each set (a folder with manifest.jsonl, the set's name is the
folder's), in manifest order until the size budget is spent; a `train` set loses every row
whose sentence shares a word 6-gram with the held-apart text (which may have changed since the
speech was made); `--not-in` leaves out the rows an earlier pack carries (a second pack for a
warm machine that keeps the first). unpack: extracts and decodes each set to 16 kHz 16-bit WAV with libsndfile
(through ctypes: the GPU machine has the engines' libsndfile, not the soundfile package), writing
OUT/SET/manifest.jsonl. merge: manifests into one (`PATH*N`: its rows N times), with absolute
audio paths, in a seeded shuffled order (train.py's dev set is the first --dev-utts rows).
join: sets made by separate jobs (one per core) as one set folder that pack takes: a link to
each part and their rows, as they are now, in one manifest. shrink: a pack with the first N rows of
each of a pack's sets (`recipes/rehearse.sh`).
"""
from __future__ import annotations

import argparse
import ctypes
import io
import json
import multiprocessing
import random
import tarfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import ngrams
from .synth import write_wav

SFM_READ = 0x10


class SFInfo(ctypes.Structure):
    _fields_ = [("frames", ctypes.c_int64), ("samplerate", ctypes.c_int), ("channels", ctypes.c_int),
                ("format", ctypes.c_int), ("sections", ctypes.c_int), ("seekable", ctypes.c_int)]


def _libsndfile() -> ctypes.CDLL:
    lib = ctypes.CDLL("libsndfile.so.1")
    lib.sf_open.restype = ctypes.c_void_p
    lib.sf_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(SFInfo)]
    lib.sf_readf_short.restype = ctypes.c_int64
    lib.sf_readf_short.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.sf_close.argtypes = [ctypes.c_void_p]
    lib.sf_strerror.restype = ctypes.c_char_p
    lib.sf_strerror.argtypes = [ctypes.c_void_p]
    return lib


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """Any file libsndfile reads (WAV, FLAC, Ogg/Opus, Ogg/Vorbis) as int16 mono and its rate."""
    lib = _libsndfile()
    info = SFInfo()
    handle = lib.sf_open(str(path).encode(), SFM_READ, ctypes.byref(info))
    if not handle:
        raise OSError(f"{path}: {lib.sf_strerror(None).decode()}")
    try:
        parts, block = [], np.empty((16384, info.channels), dtype=np.int16)
        while (n := lib.sf_readf_short(handle, block.ctypes.data, block.shape[0])) > 0:
            parts.append(block[:n].copy())
    finally:
        lib.sf_close(handle)
    pcm = np.concatenate(parts) if parts else np.zeros((0, info.channels), dtype=np.int16)
    return pcm.mean(axis=1).round().astype(np.int16) if info.channels > 1 else pcm[:, 0], info.samplerate


def read_rows(manifest: Path) -> list[dict[str, Any]]:
    """A manifest's rows (a partly written last line, from a job still running, is skipped)."""
    rows = []
    for line in manifest.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def select(rows: list[dict[str, Any]], folder: Path, budget: int, apart: set[str]
           ) -> list[dict[str, Any]]:
    """Rows in order while their files fit in `budget` bytes; rows sharing a 6-gram with `apart`
    (hashes) are dropped."""
    out, used = [], 0
    for row in rows:
        if apart and not ngrams.hashes(row["text"]).isdisjoint(apart):
            continue
        path = folder / row["audio"]
        if not path.exists():
            continue
        size = path.stat().st_size
        if used + size > budget:
            break
        out.append(row)
        used += size
    return out


def _manifests(tar: tarfile.TarFile) -> dict[str, list[dict[str, Any]]]:
    """The rows of each set a pack carries, by set name."""
    out = {}
    for member in tar.getmembers():
        if member.name.endswith("/manifest.jsonl"):
            text = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
            out[member.name.split("/")[0]] = [json.loads(line) for line in text.splitlines() if line]
    return out


def _add_manifest(tar: tarfile.TarFile, name: str, rows: list[dict[str, Any]]) -> None:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    info = tarfile.TarInfo(f"{name}/manifest.jsonl")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def packed_rows(packs: list[Path]) -> set[tuple[str, str]]:
    """(set, audio) of every row the packs carry."""
    out = set()
    for path in packs:
        with tarfile.open(path) as tar:
            out |= {(name, r["audio"]) for name, rows in _manifests(tar).items() for r in rows}
    return out


def pack(sets: list[Path], out: Path, max_bytes: int, held_apart: list[Path],
         not_in: Sequence[Path] = ()) -> dict[str, int]:
    """Pack the sets, in the order given, into one tar.xz whose audio files sum to at most
    `max_bytes` (the tar.xz comes out ~10 % smaller: xz saves more on the Ogg pages than the tar
    headers cost), leaving out the rows the `not_in` packs carry; return the utterances packed
    per set."""
    apart = {h for p in held_apart for s in p.read_text().splitlines() for h in ngrams.hashes(s)}
    already = packed_rows(list(not_in))
    counts: dict[str, int] = {}
    left = max_bytes
    sets = [f for f in sets if (f / "manifest.jsonl").exists()]  # a set not begun yet is left out
    with tarfile.open(out, "w:xz", preset=1) as tar:
        for folder in sets:
            rows = [r for r in read_rows(folder / "manifest.jsonl") if (folder.name, r["audio"]) not in already]
            rows = select(rows, folder, left, apart if folder.name == "train" else set())
            for row in rows:
                tar.add(folder / row["audio"], f"{folder.name}/{row['audio']}")
                left -= (folder / row["audio"]).stat().st_size
            _add_manifest(tar, folder.name, rows)
            counts[folder.name] = len(rows)
    return counts


def shrink(pack_path: Path, out: Path, rows: int) -> dict[str, int]:
    """OUT: the pack at `pack_path` with the first `rows` rows of each set (a set stays, emptied or not)."""
    counts = {}
    with tarfile.open(pack_path, "r:xz") as src, tarfile.open(out, "w:xz", preset=1) as dst:
        for name, kept in _manifests(src).items():
            for row in kept[:rows]:
                audio = src.getmember(f"{name}/{row['audio']}")
                dst.addfile(audio, src.extractfile(audio))
            _add_manifest(dst, name, kept[:rows])
            counts[name] = len(kept[:rows])
    return counts


def _decode(args: tuple[Path, Path, dict[str, Any]]) -> dict[str, Any] | None:
    src, dst, row = args
    try:
        pcm, rate = read_audio(src / row["audio"])
    except OSError:
        return None
    if rate != 16000 or pcm.size == 0:
        return None
    wav = str(Path(row["audio"]).with_suffix(".wav"))
    write_wav(dst / wav, pcm.astype(np.float32) / 32767)
    return {**row, "audio": wav, "duration": round(pcm.size / rate, 3)}


def unpack(pack_path: Path, out: Path, workers: int) -> dict[str, int]:
    """Extract a pack under OUT/packed and decode each set to OUT/SET (WAV + manifest.jsonl)."""
    packed = out / "packed"
    packed.mkdir(parents=True, exist_ok=True)
    with tarfile.open(pack_path, "r:xz") as tar:
        tar.extractall(packed, filter="data")
    counts = {}
    for folder in sorted(p for p in packed.iterdir() if (p / "manifest.jsonl").exists()):
        rows = read_rows(folder / "manifest.jsonl")
        with multiprocessing.Pool(workers) as pool:
            done = [r for r in pool.map(_decode, [(folder, out / folder.name, r) for r in rows],
                                        chunksize=64) if r]
        (out / folder.name).mkdir(parents=True, exist_ok=True)  # a set packed with no rows too
        (out / folder.name / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in done))
        counts[folder.name] = len(done)
    return counts


def merge(manifests: list[str], out: Path, seed: int = 0) -> int:
    """Manifests (`PATH` or `PATH*N` for N copies of its rows) into OUT with absolute audio paths,
    shuffled by `seed`; return the row count."""
    rows = []
    for spec in manifests:
        path, _, times = spec.rpartition("*") if "*" in spec else (spec, "", "1")
        m = Path(path).resolve()
        rows += [{**r, "audio": str(m.parent / r["audio"])} for r in read_rows(m)] * int(times)
    random.Random(seed).shuffle(rows)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def join(parts: list[Path], out: Path) -> int:
    """OUT/manifest.jsonl: every part's finished rows, its audio reached through the link OUT/PART
    -> PART (PART: the part folder's name); rows kept."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for part in parts:
        link = out / part.name
        if not link.is_symlink():
            link.symlink_to(part.resolve(), target_is_directory=True)
        if (part / "manifest.jsonl").exists():
            rows += [{**r, "audio": f"{part.name}/{r['audio']}"} for r in read_rows(part / "manifest.jsonl")]
    (out / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def _encode(args: tuple[Path, Path]) -> None:
    import soundfile as sf  # on this machine only: the GPU machine has no soundfile

    src, dst = args
    dst.parent.mkdir(parents=True, exist_ok=True)
    audio, rate = sf.read(src, dtype="float32")
    sf.write(dst, audio, rate, format="OGG", subtype="OPUS", compression_level=0.96)


def encode(src: Path, out: Path, workers: int) -> int:
    """synth.py's SRC (manifest.jsonl + WAVs) -> OUT (manifest.jsonl + Ogg/Opus); rows kept."""
    rows = read_rows(src / "manifest.jsonl")
    moved = [{**r, "audio": str(Path(r["audio"]).with_suffix(".opus"))} for r in rows]
    with multiprocessing.Pool(workers) as pool:
        pool.map(_encode, [(src / r["audio"], out / m["audio"]) for r, m in zip(rows, moved)], chunksize=64)
    (out / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in moved))
    return len(moved)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("sets", type=Path, nargs="+", help="folders with manifest.jsonl")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-mib", type=float, default=15.0)
    p.add_argument("--held-apart", type=Path, nargs="*", default=[], help="dev/eval text files")
    p.add_argument("--not-in", type=Path, nargs="*", default=[], help="earlier packs: their rows are left out")
    u = sub.add_parser("unpack")
    u.add_argument("--pack", type=Path, required=True)
    u.add_argument("--out", type=Path, required=True)
    u.add_argument("--workers", type=int, default=multiprocessing.cpu_count())
    m = sub.add_parser("merge")
    m.add_argument("manifests", nargs="+", help="PATH or PATH*N (its rows N times)")
    m.add_argument("--out", type=Path, required=True)
    j = sub.add_parser("join")
    j.add_argument("parts", type=Path, nargs="+", help="set folders made by separate jobs")
    j.add_argument("--out", type=Path, required=True)
    k = sub.add_parser("shrink")
    k.add_argument("--pack", type=Path, required=True)
    k.add_argument("--out", type=Path, required=True)
    k.add_argument("--rows", type=int, default=6)
    e = sub.add_parser("encode")
    e.add_argument("--src", type=Path, required=True, help="synth.py's output folder")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--workers", type=int, default=multiprocessing.cpu_count())
    args = ap.parse_args()
    if args.cmd == "encode":
        print(json.dumps({"utterances": encode(args.src, args.out, args.workers)}))
    elif args.cmd == "pack":
        counts = pack(args.sets, args.out, int(args.max_mib * 2**20), args.held_apart, args.not_in)
        print(json.dumps({"utterances": counts, "bytes": args.out.stat().st_size}))
    elif args.cmd == "join":
        print(json.dumps({"utterances": join(args.parts, args.out)}))
    elif args.cmd == "shrink":
        print(json.dumps({"utterances": shrink(args.pack, args.out, args.rows)}))
    elif args.cmd == "unpack":
        print(json.dumps({"utterances": unpack(args.pack, args.out, args.workers)}))
    else:
        print(json.dumps({"utterances": merge(args.manifests, args.out)}))


if __name__ == "__main__":
    main()
