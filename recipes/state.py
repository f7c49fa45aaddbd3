"""Compact training-state files that travel between calls of the GPU machine.

Two limits shape them: files come back at most 16 MiB each, and everything carried to the next
call (TTS engines, text and this state) must fit in 64 MiB. So:

* Files are written whole, then optionally split into `NAME.000`, `NAME.001`, ... of at most
  `chunk_bytes` (the whole file is removed); `read_file_bytes(NAME)` reads either form, and
  `file_digest` / the `sha256` saved beside it let the reader check that the parts belong together.
* The optimizer's moment tensors can be stored as fp32 (exact), bf16, or "q8": 8 bits per value,
  a log2-magnitude code (with a sign where the tensor has negatives) quantised per block of 256
  values between the block's smallest and largest non-zero magnitude (a range of at most 2^24;
  anything smaller is raised to it, never to zero, so Adam's denominator cannot collapse); zeros
  stay exact. Relative error at most half a level: 2^(24/252) - 1 = 6.8 % for exp_avg, 3.3 %
  for exp_avg_sq. Weights are always stored fp32, exact.
"""
from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

BLOCK = 256
MAX_LOG2_RANGE = 24.0  # smaller non-zero magnitudes of a block are stored as 2^-24 x its largest
MOMENT_FORMATS = ("fp32", "bf16", "q8")


# -- 8-bit log quantisation -------------------------------------------------------------------
def q8_encode(x: Tensor) -> dict[str, Any]:
    """A float tensor -> 8-bit codes + per-block lo/step: int8 sign x 1..127 log2 levels, or, when
    nothing is negative (exp_avg_sq), uint8 1..255 levels; code 0 = exactly zero."""
    flat = x.detach().float().flatten().cpu()
    signed = bool((flat < 0).any())
    top = 127 if signed else 255
    n = flat.numel()
    nb = max((n + BLOCK - 1) // BLOCK, 1)
    padded = torch.zeros(nb * BLOCK)
    padded[:n] = flat
    blocks = padded.view(nb, BLOCK)
    mag = blocks.abs()
    nz = mag > 0
    lg = torch.log2(mag.clamp_min(torch.finfo(torch.float32).tiny))
    lo = torch.where(nz, lg, torch.full_like(lg, float("inf"))).amin(1)
    hi = torch.where(nz, lg, torch.full_like(lg, float("-inf"))).amax(1)
    empty = ~nz.any(1)
    hi = torch.where(empty, torch.zeros_like(hi), hi)
    lo = torch.where(empty, torch.zeros_like(lo), torch.maximum(lo, hi - MAX_LOG2_RANGE))
    step = ((hi - lo) / (top - 1)).clamp_min(1e-12)
    level = ((lg - lo[:, None]) / step[:, None]).round().clamp(0, top - 1) + 1
    code = torch.where(nz, level * torch.sign(blocks), torch.zeros_like(level))
    code = code.to(torch.int8 if signed else torch.uint8)
    return {"q8": code.flatten()[:n].clone(), "lo": lo, "step": step, "shape": list(x.shape)}


def q8_decode(d: dict[str, Any]) -> Tensor:
    code = d["q8"].to(torch.float32)
    n = code.numel()
    nb = d["lo"].numel()
    padded = torch.zeros(nb * BLOCK)
    padded[:n] = code
    c = padded.view(nb, BLOCK)
    mag = torch.exp2(d["lo"][:, None] + (c.abs() - 1) * d["step"][:, None])
    out = torch.where(c == 0, torch.zeros_like(mag), mag * torch.sign(c))
    return out.flatten()[:n].view(d["shape"])


def pack_tensor(x: Tensor, fmt: str) -> Any:
    if fmt == "fp32":
        return x.detach().float().cpu()
    if fmt == "bf16":
        return {"bf16": x.detach().to(torch.bfloat16).cpu()}
    if fmt == "q8":
        return q8_encode(x)
    raise ValueError(f"moment format {fmt!r}: use one of {MOMENT_FORMATS}")


def unpack_tensor(v: Any) -> Tensor:
    if isinstance(v, Tensor):
        return v
    if "bf16" in v:
        return v["bf16"].float()
    return q8_decode(v)


def pack_optimizer(sd: dict[str, Any], fmt: str) -> dict[str, Any]:
    """An Adam/AdamW state dict with its moment tensors packed (`step` and the rest kept)."""
    state = {}
    for k, s in sd["state"].items():
        state[k] = {name: pack_tensor(v, fmt) if isinstance(v, Tensor) and v.numel() > 1 else v
                    for name, v in s.items()}
    return {"state": state, "param_groups": sd["param_groups"], "moments": fmt}


def unpack_optimizer(sd: dict[str, Any]) -> dict[str, Any]:
    state = {k: {name: unpack_tensor(v) if isinstance(v, (Tensor, dict)) else v for name, v in s.items()}
             for k, s in sd["state"].items()}
    return {"state": state, "param_groups": sd["param_groups"]}


# -- whole or split files ---------------------------------------------------------------------
def chunk_paths(path: Path) -> list[Path]:
    """NAME.000, NAME.001, ... that exist, in order (stops at the first gap)."""
    out: list[Path] = []
    while (p := path.with_name(f"{path.name}.{len(out):03d}")).exists():
        out.append(p)
    return out


def exists(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    return p.exists() or bool(chunk_paths(p))


def read_file_bytes(path: str | os.PathLike[str]) -> bytes:
    """The file, or its parts joined if only NAME.000... exist."""
    p = Path(path)
    if p.exists():
        return p.read_bytes()
    parts = chunk_paths(p)
    if not parts:
        raise FileNotFoundError(f"{p} (nor {p.name}.000 ...)")
    return b"".join(q.read_bytes() for q in parts)


def write_file_bytes(path: str | os.PathLike[str], data: bytes, chunk_bytes: int | None = None) -> list[Path]:
    """Write atomically (temp + rename each file): whole, or with `chunk_bytes` always as
    parts NAME.000... (even one); remove the other form and stale parts. Returns the files."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if chunk_bytes is None:
        pieces = [(p, data)]
    else:
        pieces = [(p.with_name(f"{p.name}.{i // chunk_bytes:03d}"), data[i: i + chunk_bytes])
                  for i in range(0, max(len(data), 1), chunk_bytes)]
    tmps = []
    for target, blob in pieces:
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(blob)
        tmps.append((tmp, target))
    for tmp, target in tmps:
        os.replace(tmp, target)
    written = {t for _, t in tmps}
    for stale in [p, *chunk_paths(p), *[p.with_name(f"{p.name}.{i:03d}") for i in range(len(pieces), len(pieces) + 8)]]:
        if stale not in written and stale.exists():
            stale.unlink()
    return [t for _, t in tmps]


def file_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def save_object(obj: Any, path: str | os.PathLike[str], chunk_bytes: int | None = None) -> str:
    """torch.save to bytes, write (maybe split); return the sha256 of the whole file."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    write_file_bytes(path, data, chunk_bytes)
    return file_digest(data)


def load_object(path: str | os.PathLike[str], sha256: str | None = None) -> Any:
    data = read_file_bytes(path)
    if sha256 is not None and file_digest(data) != sha256:
        raise ValueError(f"{path}: sha256 does not match (parts from different saves?)")
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def load_streamd_any(path: str | os.PathLike[str]) -> Any:
    """`streamd.model.checkpoint.load_model` for a whole file or its NAME.000... parts."""
    import tempfile

    from streamd.model.checkpoint import load_model

    p = Path(path)
    if p.exists():
        return load_model(p)
    with tempfile.TemporaryDirectory(prefix="streamd-model-") as tmp:
        whole = Path(tmp) / p.name
        whole.write_bytes(read_file_bytes(p))
        return load_model(whole)
