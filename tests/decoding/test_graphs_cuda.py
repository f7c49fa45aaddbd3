"""CUDA-graph label-looping decoding on a GPU: parity with the reference decoder in both graph
modes, streams joining and leaving, and moves of the model while decoding continues (with a
negative control showing what a decoder that does not rebuild would do)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from helpers import random_model, run_streams, synthetic_audio
from streamd.decoding.cuda_conditional import unsupported_reason
from streamd.decoding.graphs import (EAGER, FULL_GRAPH, NO_WHILE_LOOPS, BucketedGraphDecoder, GraphGreedyLabelLooping,
                                     make_decoder)
from streamd.decoding.greedy import GreedyLabelLooping
from streamd.model.transducer import Transducer
from test_graphs_rebuild import CapacityAndDeviceIndexOnly, n_labels, simulate, trained_like

pytestmark = pytest.mark.cuda
MODES = (FULL_GRAPH, NO_WHILE_LOOPS)


@pytest.fixture(autouse=True)
def _exact_fp32() -> Iterator[None]:
    """No TF32: the graphs run the batch padded to capacity, and TF32 rounding in differently
    shaped kernels could flip near-tied argmaxes between the two paths."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def reference(m: Transducer) -> GreedyLabelLooping:
    return GreedyLabelLooping(m.decoder, m.joint, m.dims.blank_id)


def graphs(m: Transducer, mode: str = FULL_GRAPH, max_batch: int = 8, cls: type = GraphGreedyLabelLooping
           ) -> GraphGreedyLabelLooping:
    return cls(m.decoder, m.joint, m.dims.blank_id, max_batch=max_batch, mode=mode)


def expect_mode(d: GraphGreedyLabelLooping, mode: str) -> None:
    """full_graph must be what runs wherever the machine supports conditional nodes."""
    if mode == FULL_GRAPH and unsupported_reason(d.key.device) is not None:
        assert d.mode == NO_WHILE_LOOPS
    else:
        assert d.mode == mode, d.fallback_reason


def make(kind: str, seed: int) -> Transducer:
    return (random_model(seed) if kind == "random" else trained_like(seed)).cuda()


# -- parity ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch", [1, 7, 64, 256])
@pytest.mark.parametrize("kind", ["random", "trained"])
def test_graphs_equal_reference(kind: str, batch: int, mode: str) -> None:
    """Identical tokens and timestamps over many chunks of lengths 1-14, streams joining and
    leaving, rows of the batch shorter than the chunk, batch from 1 to capacity."""
    m = make(kind, seed=batch)
    d = graphs(m, mode, max_batch=batch)
    want, got = simulate([reference(m), d], m, slots=batch, chunks=30, seed=batch)
    assert got == want and n_labels(want) > 5 * batch
    expect_mode(d, mode)
    assert d.rebuilds == 1


def test_full_graph_is_available_here() -> None:
    """Report (and on a machine that should support it, require) the full-graph mode."""
    m = make("trained", 0)
    d = graphs(m, "auto")
    d(torch.randn(2, 5, m.dims.d_model, device="cuda"), torch.tensor([5, 3], device="cuda"))
    print(f"mode={d.mode} reason={d.fallback_reason} unsupported={unsupported_reason(d.key.device)}")
    expect_mode(d, FULL_GRAPH)


def test_a_bucket_captures_again_after_every_graph_of_its_pool_was_dropped() -> None:
    """A reset (or a move's key change) drops every graph of the buckets' shared pool; the next
    captures go into a fresh pool id and replay. Into the old id they failed torch 2.11's
    `use_count > 0` assertion in the pinned-host allocator (an H100, 2026-12-06), and the
    bucket decoded eagerly from then on."""
    m = make("random", 5)
    d = make_decoder(m, "auto", per_octave=4)
    g = torch.Generator().manual_seed(0)
    enc = torch.randn(6, 9, m.dims.d_model, generator=g).cuda()
    lengths = torch.tensor([9, 9, 7, 5, 9, 1], device="cuda")
    want = reference(m)(enc, lengths)[0].to_lists()
    for _ in range(3):
        got = d(enc, lengths)[0].to_lists()
        assert d.mode != EAGER, d.fallback_reason
        assert got == want
        d.reset()


@pytest.mark.parametrize("mode", MODES)
def test_recognizer_streams_joining_and_leaving(mode: str) -> None:
    audios = [synthetic_audio(s, i) for i, s in enumerate([0.5, 3.1, 1.7, 2.4, 0.9, 4.0, 1.2])]
    starts = [0, 3, 3, 7, 12, 1, 20]
    m = random_model(3, att_context_sizes=((16, 3),)).cuda()
    want, _ = run_streams(m, reference(m), audios, starts)
    d = graphs(m, mode, max_batch=7)
    got, _ = run_streams(m, d, audios, starts)
    assert got == want and sum(len(t) for t, _ in want) > 0
    expect_mode(d, mode)


def test_bf16_graphs_agree_with_bf16_reference() -> None:
    """bf16 rounding of differently shaped kernels can flip exact ties, so report agreement and
    require it to be high; fp32 is exact (above)."""
    m = make("trained", 3).to(torch.bfloat16)
    d = graphs(m, FULL_GRAPH, max_batch=64)
    want, got = simulate([reference(m), d], m, slots=64, chunks=30, seed=3)
    same = sum(got[k] == want[k] for k in want)
    print(f"bf16: {same}/{len(want)} streams identical, mode={d.mode}")
    assert same >= 0.9 * len(want) and d.key.dtype == torch.bfloat16


# -- moves while decoding continues ------------------------------------------------------------
AUDIOS = [synthetic_audio(s, 10 + i) for i, s in enumerate([2.8, 1.1, 3.5, 2.0, 0.7])]
STARTS = [0, 2, 5, 8, 22]


def streams_with(events: Callable[[Transducer], dict[int, Callable[[], Any]]], decoder: Callable[[Transducer], Any],
                 device: str = "cuda") -> tuple[list, list[str], Any]:
    m = random_model(4, att_context_sizes=((16, 3),)).to(device)  # fresh: moves can round weights
    d = decoder(m)
    got, modes = run_streams(m, d, AUDIOS, STARTS, seed=1, events=events(m))
    return got, modes, d


def test_fp32_bf16_fp32_on_cuda() -> None:
    def moves(m: Transducer) -> dict[int, Callable[[], Any]]:
        return {8: lambda: m.to(torch.bfloat16), 16: lambda: m.to(torch.float32)}

    want, _, _ = streams_with(moves, reference)
    got, modes, d = streams_with(moves, lambda m: graphs(m, max_batch=5))
    assert d.rebuilds == 3 and d.key.dtype == torch.float32
    assert "dtype torch.bfloat16 -> torch.float32" in d.last_rebuild_reason
    assert EAGER not in modes
    # streams decoded only in fp32 are identical; the rest went through bf16 (see the bf16 test)
    fp32_only = [i for i, s in enumerate(STARTS) if s >= 16]
    assert all(got[i] == want[i] for i in fp32_only)
    same = sum(g == w for g, w in zip(got, want))
    print(f"fp32->bf16->fp32: {same}/{len(want)} streams identical to the reference with the same moves")


def test_cpu_cuda_cpu() -> None:
    def moves(m: Transducer) -> dict[int, Callable[[], Any]]:
        return {6: lambda: m.to("cuda"), 18: lambda: m.to("cpu")}

    want, _, _ = streams_with(lambda m: {}, reference, device="cpu")  # all on the CPU, no moves
    got, modes, d = streams_with(moves, lambda m: graphs(m, max_batch=5), device="cpu")
    assert got == want
    assert modes[0] == modes[-1] == EAGER and (FULL_GRAPH in modes or NO_WHILE_LOOPS in modes)
    assert d.rebuilds == 1


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda0_cuda1_cuda0() -> None:
    def moves(m: Transducer) -> dict[int, Callable[[], Any]]:
        return {6: lambda: m.to("cuda:1"), 18: lambda: m.to("cuda:0")}

    want, _, _ = streams_with(lambda m: {}, reference)
    got, _, d = streams_with(moves, lambda m: graphs(m, max_batch=5))
    assert got == want and d.rebuilds == 3 and d.key.device == torch.device("cuda", 0)


def _replace(m: Transducer, donor_seed: int | None, assign: bool, decoder_only: bool = False) -> Callable[[], Any]:
    """Load weights (the model's own values if donor_seed is None) into m mid-stream; with
    decoder_only, only the prediction net's and joint's."""
    def run() -> None:
        src = m if donor_seed is None else random_model(donor_seed, att_context_sizes=((16, 3),))
        for dst, part in [(m.decoder, src.decoder), (m.joint, src.joint)] if decoder_only else [(m, src)]:
            sd = {k: v.detach().clone().to(m.device) for k, v in part.state_dict().items()}
            dst.load_state_dict(sd, assign=assign)
    return run


@pytest.mark.parametrize("assign", [True, False])
def test_weights_replaced_with_the_same_values_change_nothing(assign: bool) -> None:
    want, _, _ = streams_with(lambda m: {}, reference)
    got, _, d = streams_with(lambda m: {9: _replace(m, None, assign)}, lambda m: graphs(m, max_batch=5))
    assert got == want
    assert d.rebuilds == (2 if assign else 1)  # new storage -> recapture; in place -> graphs stay valid


@pytest.mark.parametrize("assign", [True, False])
def test_new_weights_mid_stream_equal_the_reference(assign: bool) -> None:
    def swap(m: Transducer) -> dict[int, Callable[[], Any]]:
        return {9: _replace(m, 7, assign)}

    want, _, _ = streams_with(swap, reference)
    got, _, _ = streams_with(swap, lambda m: graphs(m, max_batch=5))
    assert got == want


# -- negative control: graphs that were not rebuilt --------------------------------------------
def test_without_the_full_key_a_cast_crashes() -> None:
    def moves(m: Transducer) -> dict[int, Callable[[], Any]]:
        return {8: lambda: m.to(torch.bfloat16)}

    with pytest.raises(RuntimeError):
        streams_with(moves, lambda m: graphs(m, max_batch=5, cls=CapacityAndDeviceIndexOnly))
    streams_with(moves, lambda m: graphs(m, max_batch=5))  # the real decoder copes


def test_without_the_full_key_new_weights_are_ignored() -> None:
    kept: list[torch.Tensor] = []

    def swap(m: Transducer) -> dict[int, Callable[[], Any]]:
        def run() -> None:
            kept.extend(p.detach() for p in m.parameters())  # keep the old storage intact
            _replace(m, 7, assign=True, decoder_only=True)()
        return {9: run}

    want, _, _ = streams_with(swap, reference)
    old, _, _ = streams_with(lambda m: {}, reference)
    stale, _, d = streams_with(swap, lambda m: graphs(m, max_batch=5, cls=CapacityAndDeviceIndexOnly))
    got, _, _ = streams_with(swap, lambda m: graphs(m, max_batch=5))
    assert got == want and want != old
    # the stale graphs still run the old prediction net and joint (only the encoder projection,
    # done outside the graphs, uses the new weights): the output matches neither model
    assert d.rebuilds == 1 and stale != want and stale != old


def test_without_the_full_key_a_device_round_trip_reads_dead_memory() -> None:
    old_storage: list[torch.Tensor] = []

    def moves(m: Transducer) -> dict[int, Callable[[], Any]]:
        def to_cpu() -> None:
            old_storage.extend(p.detach() for p in m.parameters())  # keep, then scribble over it
            m.to("cpu")

        def back() -> None:
            m.to("cuda")
            for t in old_storage:
                t.normal_()
        return {8: to_cpu, 12: back}

    want, _, _ = streams_with(lambda m: {}, reference)
    got, _, _ = streams_with(moves, lambda m: graphs(m, max_batch=5))
    old_storage.clear()
    stale, _, _ = streams_with(moves, lambda m: graphs(m, max_batch=5, cls=CapacityAndDeviceIndexOnly))
    assert got == want and stale != want


# -- memory and re-capture cost ----------------------------------------------------------------
def test_rebuilds_free_the_old_graphs_memory() -> None:
    m = make("trained", 0)
    d = graphs(m, max_batch=256)
    enc, lengths = torch.randn(256, 14, m.dims.d_model, device="cuda"), torch.full((256,), 14, device="cuda")
    d(enc, lengths)
    base = torch.cuda.memory_reserved()
    for i in range(4):
        m.to(torch.bfloat16 if i % 2 == 0 else torch.float32)
        d(enc, lengths)
        mib = torch.cuda.memory_reserved() / 2**20
        print(f"rebuild {d.rebuilds}: {d.last_capture_ms:.0f} ms, reserved {mib:.0f} MiB")
    assert d.rebuilds == 5
    assert torch.cuda.memory_reserved() <= base * 1.5 + 64 * 2**20


def test_autocast_callers_and_long_inputs() -> None:
    """Graph decoding ignores a caller's autocast (real fp32 weights stay fp32), and a call past
    the frame capacity grows it and re-captures."""
    m = make("trained", 5)
    d, ref = graphs(m, max_batch=4), reference(m)
    enc = torch.randn(3, 14, m.dims.d_model, device="cuda")
    lengths = torch.tensor([14, 9, 0], device="cuda")
    want = ref(enc, lengths)[0].to_lists()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = d(enc, lengths)[0].to_lists()
    assert got == want and d.key.dtype == torch.float32
    long_enc = torch.randn(2, 300, m.dims.d_model, device="cuda")
    long_len = torch.tensor([300, 211], device="cuda")
    assert d(long_enc, long_len)[0].to_lists() == ref(long_enc, long_len)[0].to_lists()
    assert d.rebuilds == 2 and d.key.frames == 304


def test_make_decoder_on_cuda() -> None:
    from streamd.decoding.graphs import make_decoder
    m = make("trained", 6)
    d = make_decoder(m, "auto", max_batch=8)
    assert isinstance(d, GraphGreedyLabelLooping)
    want, got = simulate([reference(m), d], m, slots=8, chunks=10, seed=6)
    assert got == want
    expect_mode(d, FULL_GRAPH)
    assert type(make_decoder(m, "eager")) is GreedyLabelLooping


@pytest.mark.usefixtures("exact_buckets")
def test_a_size_replaying_a_larger_captured_bucket_equals_reference() -> None:
    """Captures spaced: 7 rows replay the graphs of 12 (padded), the same labels as the reference;
    5 rows capture their own."""
    m = trained_like().cuda()
    d, ref = BucketedGraphDecoder(m.decoder, m.joint, m.dims.blank_id, per_octave=2), reference(m)
    d.capture_spacing_s = 60.0
    g = torch.Generator(device="cuda").manual_seed(4)
    for b in (12, 7, 5, 7):
        enc = torch.randn((b, 7, m.dims.d_model), device="cuda", generator=g)
        lengths = torch.full((b,), 7, device="cuda")
        assert d(enc, lengths)[0].to_lists() == ref(enc, lengths)[0].to_lists()
        assert d.mode != EAGER
    assert d.captured() == [6, 12]


@pytest.mark.usefixtures("exact_buckets")
def test_held_captures_decode_eagerly_on_cuda_and_capture_after() -> None:
    """Captures held (a move prepared): 7 rows replay the graphs of 12, padded; 5 rows decode
    eagerly, carrying their state on, the same labels as the reference; released, 5 rows capture."""
    m = trained_like().cuda()
    d, ref = BucketedGraphDecoder(m.decoder, m.joint, m.dims.blank_id, per_octave=2), reference(m)
    g = torch.Generator(device="cuda").manual_seed(5)
    state, ref_state = None, None
    for b, hold in ((12, False), (7, True), (5, True), (5, True), (5, False)):
        d.hold_captures = hold
        enc = torch.randn((b, 7, m.dims.d_model), device="cuda", generator=g)
        lengths = torch.full((b,), 7, device="cuda")
        if state is not None and state.batch != b:
            state, ref_state = None, None
        got, state = d(enc, lengths, state)
        want, ref_state = ref(enc, lengths, ref_state)
        assert got.to_lists() == want.to_lists()
        assert (d.mode == EAGER) == (hold and b == 5)
    assert d.captured() == [6, 12]
