"""The attention kernel alone at a 160-ms step's shape (1024 streams of 2 query frames, 70 cached keys read in place
from 8192 slots' rings, 8 heads of 64, bf16), launched with 1, 2, 4 (Triton's default) and 8 warps a program:
median CUDA-graph replay, the K/V bytes read a second, and the largest difference from the default's output.

    python benchmarks/h100-2026-12-07f/attn_warps.py
"""
import sys

import torch

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
from graph_replay import graph_ms  # noqa: E402
import streamd.model.attention_kernel as ak  # noqa: E402

extra: dict = {}


class WithOptions:
    """The kernel, launched with the launch options in `extra` too (`_launch` reads the module's kernel)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kwargs: launch(*args, **kwargs, **extra)


ak._window_attention = WithOptions(ak._window_attention)
torch.manual_seed(0)
S, B, T, C, H, DK = 8192, 1024, 2, 70, 8, 64
n = C + T
dev, dt = "cuda", torch.bfloat16
ring = torch.randn(S, C, 2 * H * DK, device=dev, dtype=dt)  # one layer's slot rings: keys | values
keys, values = ring[..., :H * DK].view(S, C, H, DK), ring[..., H * DK:].view(S, C, H, DK)
fresh = torch.randn(B, T, 2 * H * DK, device=dev, dtype=dt)
new_keys, new_values = fresh[..., :H * DK].view(B, T, H, DK), fresh[..., H * DK:].view(B, T, H, DK)
q = torch.randn(B, T, H, DK, device=dev, dtype=dt)
p = torch.randn(2 * n - 1, H, DK, device=dev, dtype=dt)
u, w = torch.randn(H, DK, device=dev, dtype=dt), torch.randn(H, DK, device=dev, dtype=dt)
mask = torch.rand(B, T, n, device=dev) < 0.05
head = torch.randint(0, C, (B,), device=dev)
order = torch.cat([(torch.arange(C, device=dev)[None] - head[:, None]) % C, torch.arange(C, n, device=dev).expand(B, T)], 1)
rows = torch.randperm(S, device=dev)[:B]
kv_bytes = B * n * 2 * H * DK * 2


def call():
    return ak.window_attention(q, keys, values, p, u, w, mask, order, DK ** -0.5, new_keys, new_values, rows)


ref = call()
for rep in range(2):
    for warps in (4, 1, 2, 8):
        extra = {"num_warps": warps}
        out = call()
        ms = graph_ms(call)
        print(f"num_warps {warps}: {1e3 * ms:.1f} us a call, K/V {kv_bytes / ms / 1e9:.2f} TB/s, "
              f"max |diff| {(out.float() - ref.float()).abs().max().item():.2e}", flush=True)
