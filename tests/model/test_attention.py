"""The fused attention path (SDPA, used on CUDA) equals the explicit one (NeMo's math, the
reference), and attention over cached keys and values equals attention over cached inputs."""
from __future__ import annotations

import pytest
import torch

from streamd.model.attention import RelPositionalEncoding, RelPositionMultiHeadAttention


CASES = [(10, 3), (0, 5), (70, 2)]


def _attention(seed: int, device: str) -> RelPositionMultiHeadAttention:
    """A 64-wide, 4-head attention with random weights and biases (u, v and the projections'),
    on its `fused` paths (not the Triton kernel: test_attention_kernel compares that one)."""
    torch.manual_seed(seed)
    att = RelPositionMultiHeadAttention(64, 4, bias=True).to(device)
    att.kernel = False
    with torch.no_grad():
        for p in att.parameters():
            p.normal_(0.0, 0.2)
    return att


def _inputs(b: int, cache: int, t: int, device: str, width: int = 64
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T, width) queries, (B, cache, width) cached inputs, the positional table and a random
    (B, T, cache + T) mask whose row 1 is all padding."""
    query, cached = torch.randn(b, t, width, device=device), torch.randn(b, cache, width, device=device)
    _, pos = RelPositionalEncoding(width, 500, xscaling=True).to(device)(query, cache + t)
    mask = torch.rand(b, t, cache + t, device=device) < 0.3
    mask[1] = True
    return query, cached, pos, mask


@pytest.mark.parametrize("cache,t", CASES)
def test_fused_attention_equals_explicit(cache: int, t: int, device: str = "cpu") -> None:
    att = _attention(0, device)
    query, cached, pos, mask = _inputs(6, cache, t, device)
    keys = torch.cat([cached, query], dim=1)
    mask[2, 0] = True  # one fully masked query
    with torch.no_grad():
        att.fused = False
        explicit = att(query, keys, pos, mask)
        att.fused = True
        fused = att(query, keys, pos, mask)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)
    # fully masked queries give linear_out(0) on both paths (NeMo zeroes them; no NaN)
    torch.testing.assert_close(fused[2, 0], att.linear_out.bias.detach())


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("cache,t", CASES)
def test_keys_in_ring_order_give_the_time_order_output(cache: int, t: int, fused: bool, device: str = "cpu") -> None:
    """Keys whose cached frames are a ring (each row rotated by its own head, `order` giving each
    key's time) attend as the same keys in time order."""
    att = _attention(2, device)
    att.fused = fused
    b, n = 6, cache + t
    query, cached, pos, mask = _inputs(b, cache, t, device)
    keys = torch.cat([cached, query], dim=1)
    head = torch.randint(0, max(cache, 1), (b,), device=device)
    ring = (torch.arange(cache, device=device)[None] - head[:, None]) % max(cache, 1)  # slot j's time
    order = torch.cat([ring, torch.arange(cache, n, device=device).expand(b, t)], dim=1)  # (B, n)
    with torch.no_grad():
        want = att(query, keys, pos, mask)
        got = att(query, keys.gather(1, order[..., None].expand(b, n, 64)), pos,
                  mask.gather(2, order[:, None].expand(b, t, n)), order)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("cache,t", CASES)
def test_fused_attention_equals_explicit_on_cuda(cache: int, t: int) -> None:
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        test_fused_attention_equals_explicit(cache, t, "cuda")
        for fused in (False, True):
            test_keys_in_ring_order_give_the_time_order_output(cache, t, fused, "cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("cache,t", CASES)
def test_cached_keys_and_values_equal_projecting_cached_inputs(cache: int, t: int, fused: bool,
                                                              device: str = "cpu") -> None:
    """`forward_cached` over the projections of cached inputs gives `forward`'s output over the
    inputs, leaves the window's cached keys and values unchanged and writes the query's after them."""
    att = _attention(1, device)
    att.fused = fused
    b = 5
    query, cached, pos, mask = _inputs(b, cache, t, device)
    with torch.no_grad():
        want = att(query, torch.cat([cached, query], dim=1), pos, mask)
        kv_cache = torch.cat([att.linear_k(cached), att.linear_v(cached)], dim=-1)
        window = torch.cat([kv_cache, torch.full((b, t, 128), float("nan"), device=device)], dim=1)
        got = att.forward_cached(query, window, pos, mask)
        kv_query = torch.cat([att.linear_k(query), att.linear_v(query)], dim=-1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(window[:, :cache], kv_cache)
    torch.testing.assert_close(window[:, cache:], kv_query)


@pytest.mark.cuda
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("cache,t", CASES)
def test_cached_keys_and_values_equal_projecting_cached_inputs_on_cuda(cache: int, t: int, fused: bool) -> None:
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        test_cached_keys_and_values_equal_projecting_cached_inputs(cache, t, fused, "cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
