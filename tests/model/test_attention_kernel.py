"""The Triton attention kernel (streaming steps on CUDA) computes the reference's function: on the
CPU through Triton's interpreter (CI), compiled on CUDA; and a streaming encoder running it still
matches NeMo's chunks."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # on a CPU-only machine, its interpreter runs the kernel (conftest.py)

import test_nemo_parity as nemo_parity  # noqa: E402
from helpers import random_model  # noqa: E402
from streamd.model.attention import RelPositionMultiHeadAttention, SlotRows  # noqa: E402
from streamd.model.dims import PRE_ENCODE_CACHE  # noqa: E402
from streamd.model.encoder import ring_order  # noqa: E402
from test_attention import CASES, _attention, _inputs  # noqa: E402

KERNEL_CASES = [*CASES, (6, 1), (8, 14)]  # with 1 and 14 query frames (80 ms, 1120 ms chunks)


def _kernel_vs_explicit(cache: int, t: int, ring: bool, device: str, dtype: torch.dtype,
                        heads: int = 4, width: int = 64, b: int = 6) -> tuple[torch.Tensor, ...]:
    """The attention's output over a window of `cache` cached keys (a ring with random heads, or
    in time order) and t query frames: with the kernel in `dtype`, with the explicit path in fp32,
    and with the reference's fused path in `dtype`."""
    torch.manual_seed(cache * 100 + t)
    att = RelPositionMultiHeadAttention(width, heads, bias=True).to(device)
    with torch.no_grad():
        for p in att.parameters():
            p.normal_(0.0, 0.2)
    query, _, pos, mask = _inputs(b, cache, t, device, width)
    mask[2, 0] = True  # one fully masked query, besides row 1 all padding
    n = cache + t
    keys = torch.randn(b, n, width, device=device)
    values = torch.randn(b, n, width, device=device)
    order = ring_order(torch.randint(0, max(cache, 1), (b,), device=device), cache, t) if ring else None
    with torch.no_grad():
        att.kernel, att.fused = False, False
        want = att._attend(query, keys, values, pos, mask, order)
        att.to(dtype)
        low = [x.to(dtype) for x in (query, keys, values, pos)]
        att.kernel = True
        got = att._attend(*low, mask, order)
        att.kernel, att.fused = False, True
        fused = att._attend(*low, mask, order)
    return got.float(), want, fused.float()


@pytest.mark.parametrize("ring", [False, True], ids=["time_order", "ring"])
@pytest.mark.parametrize("cache,t", KERNEL_CASES)
def test_kernel_equals_the_explicit_attention(cache: int, t: int, ring: bool) -> None:
    """fp32: the same scores, positions by relative distance (in ring order), masks and
    softmax; fully masked queries give zeros (the output is linear_out's bias)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    got, want, _ = _kernel_vs_explicit(cache, t, ring, device, torch.float32)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cache,t", KERNEL_CASES)
def test_cached_keys_and_values_read_from_slots_in_place(cache: int, t: int) -> None:
    """`forward_cached` with `SlotRows`: the window holds only the chunk's frames and the cached
    keys and values stay in the slots' rings (rows in any order, one repeated: a bucket's padded
    rows; a column of the step's metadata, not contiguous). With the kernel reading them in
    place, and on the reference path (which gathers them), it equals the explicit attention over
    the gathered window, in ring order, fp32."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    att = _attention(7, device)
    b = 5
    query, _, pos, mask = _inputs(b, cache, t, device)
    rings = torch.randn(9, cache, 128, device=device)
    rows = torch.tensor([[4, 1], [0, 1], [8, 1], [4, 1], [2, 1]], device=device)[:, 0]  # strided, as a step's
    order = ring_order(torch.randint(0, max(cache, 1), (b,), device=device), cache, t)
    with torch.no_grad():
        att.fused = False
        want = att.forward_cached(query, torch.cat([rings[rows], torch.empty(b, t, 128, device=device)], 1), pos,
                                  mask, order)
        for kernel in (True, False):
            att.kernel = kernel
            chunk = torch.full((b, t, 128), float("nan"), device=device)
            before = rings.clone()
            got = att.forward_cached(query, chunk, pos, mask, order, SlotRows(rings, rows))
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            assert torch.equal(rings, before)  # read, never written
            torch.testing.assert_close(chunk, torch.cat([att.linear_k(query), att.linear_v(query)], -1))


def test_the_kernel_runs_only_where_it_may() -> None:
    """By default: CUDA steps without autograd and with few query frames; never when told not to."""
    att = _attention(0, "cpu")
    att.kernel = None
    query = torch.zeros(2, 2, 64)
    with torch.no_grad():
        assert not att._kernel(query)  # a CPU tensor (the interpreter only when asked)
        att.kernel = True
        assert att._kernel(query)
        assert not att._kernel(torch.zeros(2, 17, 64))  # an offline pass: the reference
        att.kernel = False
        assert not att._kernel(query)


@pytest.mark.parametrize("context", [(70, 1), (70, 13)])
def test_a_streaming_encoder_over_slot_rings_gives_the_same_frames_with_the_kernel(context: tuple[int, int]) -> None:
    """Three streams in ring slots, joining at different steps (so their rings' heads differ),
    stepped with every attention on the kernel (reading the cached keys and values from the
    rings in place) and on the explicit path (gathering them): the same frames, fp32."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    m = random_model(5, d_model=64).to(device)  # heads of 16: the kernel's smallest
    width = PRE_ENCODE_CACHE + 8 * (context[1] + 1)
    rings = {on: m.encoder.init_cache(3, context, device, torch.float32, kv=True, ring=True) for on in (False, True)}
    gen = torch.Generator().manual_seed(0)
    RelPositionMultiHeadAttention.kernel = True
    assert m.encoder.reads_slots(torch.device(device), context[1] + 1)  # the rings read in place
    try:
        with torch.no_grad():
            for step in range(9):
                rows = torch.tensor([r for r in range(3) if step >= 3 * r], device=device)
                mel = torch.randn(len(rows), m.dims.features.n_mels, width, generator=gen).to(device)
                lengths = torch.full((len(rows),), width, device=device)
                start = torch.zeros(len(rows), dtype=torch.long, device=device)
                out = {}
                for on in (False, True):
                    RelPositionMultiHeadAttention.kernel = on
                    out[on] = m.encoder.streaming_forward(mel, lengths, rings[on], context, start=start, rows=rows)[0]
                torch.testing.assert_close(out[True], out[False], atol=1e-5, rtol=1e-5)
    finally:
        RelPositionMultiHeadAttention.kernel = None
    assert len(set(rings[True].head.tolist())) > 1  # the rings are not aligned
    torch.testing.assert_close(rings[True].channel, rings[False].channel, atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", nemo_parity.MODELS)
def test_streaming_chunks_match_nemo_with_the_kernel_on_cuda(kind: str) -> None:
    """NeMo's streaming chunks, every context, key/value cache, every attention on the kernel
    (fp32, TF32 off). Its CPU twin would take minutes in the interpreter: the test above is it."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    RelPositionMultiHeadAttention.kernel = True
    try:
        for ctx in nemo_parity.CONTEXTS:
            nemo_parity.test_streaming_chunks_match_nemo(kind, ctx, True, "cuda")
    finally:
        RelPositionMultiHeadAttention.kernel = None
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
        nemo_parity.fixture_model(kind).model.cpu()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t", [2, 14])
def test_kernel_in_half_precision_at_fastconformer_l_size(t: int, dtype: torch.dtype) -> None:
    """8 heads of 64, 70 cached frames in a ring, 256 streams: against the fp32 reference, the
    kernel's error is no larger than the reference path's own in that precision (SDPA's)."""
    got, want, fused = _kernel_vs_explicit(70, t, True, "cuda", dtype, heads=8, width=512, b=256)
    err, reference_err = (((x - want).norm() / want.norm()).item() for x in (got, fused))
    assert err <= 1.1 * reference_err, (err, reference_err)


def test_a_kernel_that_cannot_be_built_turns_itself_off_and_the_reference_serves(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A GPU or Triton build the kernel does not compile for (simulated: the launch raises
    Triton's error): the call returns the reference's output and the process stops trying
    (logged once; `available` says no, so status says "sdpa")."""
    import triton

    from streamd.model import attention_kernel

    def fails(*args: object) -> None:
        raise triton.TritonError("simulated: out of shared memory")

    def no_compiler(*args: object) -> None:
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")

    att = _attention(3, "cpu")
    query, cached, pos, mask = _inputs(4, 10, 2, "cpu")
    keys = torch.cat([cached, query], dim=1)
    monkeypatch.setattr(attention_kernel, "_built", set())
    with torch.no_grad():
        want = att(query, keys, pos, mask)
        att.kernel = True
        for failure in (fails, no_compiler):
            monkeypatch.setattr(attention_kernel, "_launch", failure)
            monkeypatch.setattr(attention_kernel, "broken", None)
            got = att(query, keys, pos, mask)
            torch.testing.assert_close(got, want)
            assert attention_kernel.broken and any(w in attention_kernel.broken for w in ("simulated", "C compiler"))
            assert not attention_kernel.available(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    assert [r.levelname for r in caplog.records if "attention kernel unavailable" in r.message] == ["WARNING"] * 2


def test_a_kernel_that_ran_and_then_fails_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure of a kernel that has run before is no build failure (a bug, a broken GPU): it is
    raised, not hidden behind the reference path."""
    from streamd.model import attention_kernel

    att = _attention(3, "cpu")
    att.kernel = True
    query, cached, pos, mask = _inputs(4, 10, 2, "cpu")
    keys = torch.cat([cached, query], dim=1)
    with torch.no_grad():
        att(query, keys, pos, mask)  # built and launched

        def fails(*args: object) -> None:
            raise RuntimeError("simulated: an illegal memory access")

        monkeypatch.setattr(attention_kernel, "_launch", fails)
        with pytest.raises(RuntimeError, match="illegal memory access"):
            att(query, keys, pos, mask)
    assert attention_kernel.broken is None
