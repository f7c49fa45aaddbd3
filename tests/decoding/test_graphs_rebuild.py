"""The CUDA-graph decoder's lazy rebuild logic, on the CPU: capture is replaced by a fake backend
whose "graphs" run the captured step functions eagerly on the static buffers, so everything but
the CUDA calls themselves (keys, rebuilds, buffers, padding, state carry, fallbacks) runs here."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from helpers import random_model, run_streams, synthetic_audio
from streamd.decoding.cuda_conditional import unsupported_reason
from streamd.decoding.graphs import (EAGER, FULL_GRAPH, HELD, NO_WHILE_LOOPS, BucketedGraphDecoder, GraphGreedyLabelLooping,
                                    GraphKey, make_decoder)
from streamd.decoding.greedy import GreedyLabelLooping
from streamd.decoding.state import DecoderState
from streamd.model.transducer import Transducer


class FakeGraph:
    def __init__(self, fn: Any) -> None:
        self.fn, self.replays = fn, 0

    def replay(self) -> None:
        self.replays += 1
        self.fn()


class FakeWhileGraph:
    """The conditional-node graph's control flow, run on the host."""

    def __init__(self, graphs: dict[str, FakeGraph], active_any: torch.Tensor, advance_any: torch.Tensor,
                 skip_inner: bool = False) -> None:
        self.g, self.active, self.advance, self.skip_inner = graphs, active_any, advance_any, skip_inner
        self.closed = False

    def replay(self) -> None:
        self.g["before_outer"].fn()
        while bool(self.active):
            self.g["before_inner"].fn()
            while bool(self.advance) and not self.skip_inner:
                self.g["inner"].fn()
            self.g["after_inner"].fn()

    def close(self) -> None:
        self.closed = True


class FakeBackend:
    """Graph backend for the CPU: records captures and releases."""

    def __init__(self, full: str = "ok") -> None:
        self.full = full  # "ok", "unsupported" or "broken" (skips the inner loop)
        self.captures: list[torch.device] = []
        self.releases = 0
        self.whiles: list[FakeWhileGraph] = []

    def supports(self, device: torch.device) -> bool:
        return True

    def capture(self, device: torch.device, steps: dict[str, Any], warmup: Any) -> dict[str, FakeGraph]:
        warmup()
        self.captures.append(device)
        return {k: FakeGraph(f) for k, f in steps.items()}

    def instantiate(self, graphs: dict[str, FakeGraph]) -> None:
        pass

    def full_graph(self, device: torch.device, graphs: dict[str, FakeGraph], active: torch.Tensor,
                   advance: torch.Tensor) -> FakeWhileGraph:
        if self.full == "unsupported":
            raise RuntimeError("no conditional nodes on this machine")
        w = FakeWhileGraph(graphs, active, advance, skip_inner=self.full == "broken")
        self.whiles.append(w)
        return w

    def release(self, device: torch.device) -> None:
        self.releases += 1


def trained_like(seed: int = 1) -> Transducer:
    """A random model whose joint leans to blank: about one label per 3-4 frames on N(0,1) input."""
    m = random_model(seed)
    with torch.no_grad():
        m.joint.joint_net[-1].bias[m.dims.blank_id] += 4.0
    return m


def reference(m: Transducer) -> GreedyLabelLooping:
    return GreedyLabelLooping(m.decoder, m.joint, m.dims.blank_id)


def graph_decoder(m: Transducer, backend: Any = None, **kw: Any) -> GraphGreedyLabelLooping:
    return GraphGreedyLabelLooping(m.decoder, m.joint, m.dims.blank_id, backend=backend or FakeBackend(), **kw)


def simulate(decoders: list[Any], m: Transducer, slots: int, chunks: int, seed: int,
             frames: tuple[int, ...] = (1, 2, 7, 14), between: Any = None) -> list[dict]:
    """Streams join and leave `slots` slots between chunks; each chunk decodes a random subset of
    live slots with a random chunk length (some rows shorter). Each decoder keeps its own carry.
    `between(step)` may change the model between chunks. Returns, per decoder, each stream's
    (tokens, times) keyed by (slot, generation)."""
    rng = np.random.default_rng(seed)
    carries = [d.initial_state(slots) for d in decoders]
    gen, live = [0] * slots, [False] * slots
    out: list[dict] = [{} for _ in decoders]
    for step in range(chunks):
        if between is not None:
            between(step)
        for s in range(slots):
            if live[s] and rng.random() < 0.1:
                live[s] = False
            elif not live[s] and (rng.random() < 0.5 or step % 7 == 0):
                live[s], gen[s] = True, gen[s] + 1
                for d, c in zip(decoders, carries):
                    row = torch.tensor([s], device=c.label.device)
                    c.index_copy_(row, d.initial_state(1).to(c.h.device, c.h.dtype))
        full = step % 5 == 0
        rows = [s for s in range(slots) if live[s] and (full or rng.random() < 0.7)]
        if not rows:
            continue
        t = int(rng.choice(frames))
        enc_np = rng.standard_normal((len(rows), t, m.dims.d_model)).astype(np.float32)
        len_np = np.where(rng.random(len(rows)) < 0.2, rng.integers(0, t + 1, len(rows)), t)
        device, dtype = m.device, m.dtype
        enc = torch.from_numpy(enc_np).to(device, dtype)
        lengths = torch.from_numpy(len_np).to(device)
        for k, (d, c) in enumerate(zip(decoders, carries)):
            if c.h.device != device or c.h.dtype != dtype:
                carries[k] = c = c.to(device, dtype)
            idx = torch.tensor(rows, device=device)
            hyps, new = d(enc, lengths, c.index_select(idx))
            c.index_copy_(idx, new)
            for r, (toks, times) in zip(rows, hyps.to_lists()):
                entry = out[k].setdefault((r, gen[r]), ([], []))
                entry[0].extend(toks)
                entry[1].extend(times)
    return out


def n_labels(result: dict) -> int:
    return sum(len(v[0]) for v in result.values())


# -- the key ---------------------------------------------------------------------------------
def _key(**kw: Any) -> GraphKey:
    base = {"device": torch.device("cuda", 0), "dtype": torch.float32, "weights": (1, 2, 3), "batch": 8, "frames": 20}
    base.update(kw)
    return GraphKey(**base)


def test_key_changes_name_every_difference() -> None:
    k = _key()
    assert k.changes_from(_key()) == ""
    assert k.changes_from(None) == "first call"
    assert "device cuda:1 -> cuda:0" in k.changes_from(_key(device=torch.device("cuda", 1)))
    assert "device cpu -> cuda:0" in k.changes_from(_key(device=torch.device("cpu")))
    assert "dtype torch.bfloat16 -> torch.float32" in k.changes_from(_key(dtype=torch.bfloat16))
    assert "weight storage" in k.changes_from(_key(weights=(1, 2, 4)))
    assert "capacity 4x20 -> 8x20" in k.changes_from(_key(batch=4))
    assert "capacity 8x16 -> 8x20" in k.changes_from(_key(frames=16))


def test_current_key_reads_the_model() -> None:
    m = trained_like()
    d = graph_decoder(m, max_batch=5, max_frames=12)
    k = d.current_key()
    assert (k.device, k.dtype, k.batch, k.frames) == (torch.device("cpu"), torch.float32, 5, 12)
    params = [*m.decoder.parameters(), *m.joint.parameters()]
    assert k.weights == tuple(p.data_ptr() for p in params)
    m.to(torch.bfloat16)
    k2 = d.current_key()
    assert k2.dtype == torch.bfloat16 and k2.weights != k.weights


# -- lazy capture and reuse --------------------------------------------------------------------
def test_nothing_is_captured_before_the_first_call_and_unchanged_calls_reuse() -> None:
    m, be = trained_like(), FakeBackend()
    d = graph_decoder(m, be, max_batch=4)
    assert d.key is None and be.captures == [] and d.mode == EAGER
    enc = torch.randn(3, 7, m.dims.d_model)
    lengths = torch.tensor([7, 5, 0])
    state = None
    for _ in range(5):
        _, state = d(enc, lengths, state)
    assert len(be.captures) == 1 and d.rebuilds == 1 and d.last_rebuild_reason == "first call"
    assert d.mode == FULL_GRAPH and d.key == d.current_key()


@pytest.mark.parametrize("mode", [FULL_GRAPH, NO_WHILE_LOOPS])
@pytest.mark.parametrize("kind", ["random", "trained"])
def test_fake_graphs_equal_reference_with_streams_joining_and_leaving(mode: str, kind: str) -> None:
    m = random_model(2) if kind == "random" else trained_like(2)
    be = FakeBackend()
    d = graph_decoder(m, be, max_batch=9, mode=mode)
    ref, got = simulate([reference(m), d], m, slots=9, chunks=40, seed=3)
    assert got == ref and n_labels(ref) > 100
    assert d.mode == mode and len(be.captures) == 1


def test_outputs_are_copies_not_views_of_the_static_buffers() -> None:
    m = trained_like()
    d = graph_decoder(m, max_batch=4)
    enc = torch.randn(2, 14, m.dims.d_model)
    hyps, state = d(enc, torch.tensor([14, 14]))
    loop = d._cap.loop
    for t in (*vars(hyps).values(), *vars(state).values()):
        for buf in (loop.out_labels, loop.out_times, loop.out_len, loop.state.h, loop.state.c, loop.state.gproj,
                    loop.state.label, loop.state.frames, loop.lengths):
            assert t.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()
    assert hyps.labels.shape == (2, 14 * d.max_symbols + 1)  # as the reference, not the capacity


# -- rebuilds ----------------------------------------------------------------------------------
def test_dtype_change_rebuilds_and_casts_the_carry() -> None:
    m, be = trained_like(), FakeBackend()
    d, ref = graph_decoder(m, be, max_batch=6), reference(m)
    steps = {10: lambda: m.to(torch.bfloat16), 20: lambda: m.to(torch.float32)}
    a, b = simulate([ref, d], m, slots=6, chunks=30, seed=0, between=lambda s: steps.get(s, lambda: None)())
    assert a == b
    assert len(be.captures) == 3 and be.releases == 2
    assert d.key.dtype == torch.float32 and "dtype torch.bfloat16 -> torch.float32" in d.last_rebuild_reason
    # a carry from before the move is cast to the model's dtype
    _, s = d(torch.randn(1, 3, m.dims.d_model), torch.tensor([3]), d.initial_state(1).to("cpu", torch.bfloat16))
    assert s.h.dtype == s.gproj.dtype == torch.float32


def test_replaced_weight_storage_rebuilds() -> None:
    m, other, be = trained_like(1), trained_like(5), FakeBackend()
    d, ref = graph_decoder(m, be, max_batch=5), reference(m)

    def swap(step: int) -> None:
        if step == 8:
            m.load_state_dict(other.state_dict(), assign=True)
    a, b = simulate([ref, d], m, slots=5, chunks=16, seed=1, between=swap)
    assert a == b and len(be.captures) == 2 and d.last_rebuild_reason == "weight storage replaced"


def test_in_place_weight_update_keeps_graphs_but_recomputes_the_start_state() -> None:
    m, other, be = trained_like(1), trained_like(5), FakeBackend()
    d, ref = graph_decoder(m, be, max_batch=5), reference(m)
    enc, lengths = torch.randn(5, 7, m.dims.d_model), torch.full((5,), 7)
    d(enc, lengths)
    old_sos = d._cap.sos.gproj.clone()
    m.load_state_dict(other.state_dict())  # copies into the existing storage
    assert d.current_key() == d.key
    got, _ = d(enc, lengths)  # starts from the after-SOS state of the new weights
    want, _ = ref(enc, lengths)
    assert got.to_lists() == want.to_lists()
    assert len(be.captures) == 1 and not torch.equal(old_sos, d._cap.sos.gproj)


def test_capacity_grows_and_recaptures() -> None:
    m, be = trained_like(), FakeBackend()
    d, ref = graph_decoder(m, be, max_batch=2, max_frames=8), reference(m)
    for b, t in [(2, 8), (3, 8), (3, 9), (1, 3)]:
        enc, lengths = torch.randn(b, t, m.dims.d_model), torch.full((b,), t)
        assert d(enc, lengths)[0].to_lists() == ref(enc, lengths)[0].to_lists()
    assert len(be.captures) == 3
    assert (d.key.batch, d.key.frames) == (3, 16)


def test_reset_drops_graphs_and_recaptures_on_the_next_call() -> None:
    m, be = trained_like(), FakeBackend()
    d = graph_decoder(m, be, max_batch=2)
    enc, lengths = torch.randn(2, 4, m.dims.d_model), torch.full((2,), 4)
    d(enc, lengths)
    whiles = list(be.whiles)
    d.reset()
    assert d.key is None and be.releases == 1 and whiles[0].closed
    d(enc, lengths)
    assert len(be.captures) == 2


# -- fallbacks ---------------------------------------------------------------------------------
def test_cpu_model_runs_the_reference_path_with_the_real_backend() -> None:
    m = trained_like()
    d = graph_decoder(m, backend=__import__("streamd.decoding.graphs", fromlist=["x"]).CudaGraphBackend())
    a, b = simulate([reference(m), d], m, slots=4, chunks=12, seed=4)
    assert a == b and d.mode == EAGER and d.key is None


def test_eager_mode_never_captures() -> None:
    m, be = trained_like(), FakeBackend()
    d = graph_decoder(m, be, mode=EAGER)
    a, b = simulate([reference(m), d], m, slots=3, chunks=8, seed=5)
    assert a == b and be.captures == [] and d.mode == EAGER


def test_unsupported_full_graph_falls_back_and_says_why() -> None:
    m = trained_like()
    d = graph_decoder(m, FakeBackend(full="unsupported"), mode=FULL_GRAPH)
    a, b = simulate([reference(m), d], m, slots=3, chunks=8, seed=6)
    assert a == b and d.mode == NO_WHILE_LOOPS
    assert "no conditional nodes on this machine" in d.fallback_reason


def test_full_graph_that_disagrees_with_the_steps_is_rejected() -> None:
    m = trained_like()
    be = FakeBackend(full="broken")
    d = graph_decoder(m, be, max_batch=8)
    a, b = simulate([reference(m), d], m, slots=8, chunks=10, seed=7)
    assert a == b and d.mode == NO_WHILE_LOOPS and be.whiles[0].closed
    assert "disagrees" in d.fallback_reason


def test_failed_capture_decodes_eagerly_until_the_key_changes() -> None:
    class Failing(FakeBackend):
        def capture(self, device: torch.device, steps: dict[str, Any], warmup: Any) -> dict[str, FakeGraph]:
            self.captures.append(device)
            raise RuntimeError("operation not permitted when stream is capturing")

    m, be = trained_like(), Failing()
    d = graph_decoder(m, be)
    a, b = simulate([reference(m), d], m, slots=3, chunks=8, seed=8)
    assert a == b and d.mode == EAGER and len(be.captures) == 1 and "capture failed" in d.fallback_reason
    m.to(torch.float64)
    d(torch.randn(1, 2, m.dims.d_model, dtype=torch.float64), torch.tensor([2]))
    assert len(be.captures) == 2  # a new key is tried again


def test_unsupported_reason_off_cuda() -> None:
    assert unsupported_reason(torch.device("cpu")) is not None


# -- negative control: a decoder that does not check dtype and weights -------------------------
class CapacityAndDeviceIndexOnly(GraphGreedyLabelLooping):
    """Rebuilds only for capacity growth or another device index, as NeMo's `need_reinit`;
    exists to show that the full key is needed."""

    def current_key(self) -> GraphKey:
        key, old = super().current_key(), self.key
        if old is not None and old.device.index == key.device.index and key.batch <= old.batch \
                and key.frames <= old.frames:
            return old
        return key

    def _refresh_sos(self, cap: Any) -> None:
        pass


def test_a_decoder_without_the_dtype_check_fails_after_a_cast() -> None:
    m = trained_like()
    d = CapacityAndDeviceIndexOnly(m.decoder, m.joint, m.dims.blank_id, backend=FakeBackend())
    enc, lengths = torch.randn(2, 5, m.dims.d_model), torch.full((2,), 5)
    d(enc, lengths)
    m.to(torch.bfloat16)
    with pytest.raises(RuntimeError):
        d(enc.bfloat16(), lengths)
    enc = enc.bfloat16()
    assert graph_decoder(m)(enc, lengths)[0].to_lists() == reference(m)(enc, lengths)[0].to_lists()


# -- engine integration, factory, row reset ----------------------------------------------------


def test_recognizer_with_fake_graphs_equals_eager_across_a_dtype_move() -> None:
    audios = [synthetic_audio(s, i) for i, s in enumerate([0.6, 2.2, 1.4, 1.9])]
    starts = [0, 2, 3, 9]

    def run(make: Any) -> tuple[list, list[str]]:
        m = random_model(3, att_context_sizes=((16, 3),))  # fresh: the bf16 trip rounds the weights
        moves = {6: lambda: m.to(torch.bfloat16), 14: lambda: m.to(torch.float32)}
        return run_streams(m, make(m), audios, starts, events=moves)

    be = FakeBackend()
    want, _ = run(reference)
    got, modes = run(lambda m: graph_decoder(m, be, max_batch=4))
    assert got == want and sum(len(t) for t, _ in want) > 0
    assert set(modes) == {FULL_GRAPH} and len(be.captures) == 3


def test_make_decoder() -> None:
    m = trained_like()
    if not torch.cuda.is_available():
        assert type(make_decoder(m)) is GreedyLabelLooping
    assert type(make_decoder(m, "eager")) is GreedyLabelLooping
    d = make_decoder(m, "graphs", max_batch=32, max_frames=24)
    assert isinstance(d, GraphGreedyLabelLooping) and d.requested == NO_WHILE_LOOPS
    assert (d.max_batch, d.max_frames) == (32, 24)
    assert make_decoder(m, "full_graph").requested == FULL_GRAPH
    with pytest.raises(ValueError):
        make_decoder(m, "fast")
    a, b = simulate([reference(m), d], m, slots=3, chunks=6, seed=9)  # on the CPU: the reference path
    assert a == b and d.mode == EAGER


def test_reset_rows_restores_the_start_state() -> None:
    m = trained_like()
    d = graph_decoder(m)
    _, state = d(torch.randn(3, 6, m.dims.d_model), torch.full((3,), 6))
    before = state.clone()
    d.reset_rows(state, torch.tensor([False, True, False]))
    init = d.initial_state(1)
    assert torch.equal(state.h[:, 1], init.h[:, 0]) and torch.equal(state.gproj[1], init.gproj[0])
    assert int(state.frames[1]) == 0 and int(state.label[1]) == m.dims.blank_id
    for i in (0, 2):
        assert torch.equal(state.h[:, i], before.h[:, i]) and torch.equal(state.frames[i], before.frames[i])
    d.reset_rows(state, torch.tensor([0]))
    assert torch.equal(state.gproj[0], init.gproj[0])


def test_inference_mode_callers_get_ordinary_tensors() -> None:
    m = trained_like()
    d = graph_decoder(m)
    enc, lengths = torch.randn(2, 4, m.dims.d_model), torch.full((2,), 4)
    with torch.inference_mode():
        _, s = d(enc, lengths)
    _, s2 = d(enc, lengths, s)  # buffers made under inference mode would refuse in-place updates here
    assert not s2.h.is_inference()


def test_state_carry_type() -> None:
    m = trained_like()
    _, s = graph_decoder(m)(torch.randn(2, 4, m.dims.d_model), torch.full((2,), 4))
    assert isinstance(s, DecoderState) and s.batch == 2


def test_a_callers_autocast_does_not_reach_the_decoder() -> None:
    m = trained_like()
    be = FakeBackend()
    d = graph_decoder(m, be)
    enc, lengths = torch.randn(3, 9, m.dims.d_model), torch.tensor([9, 4, 0])
    want = reference(m)(enc, lengths)[0].to_lists()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = d(enc, lengths)[0].to_lists()
        assert d.initial_state(2).h.dtype == torch.float32
    assert got == want and len(be.captures) == 1 and d.mode == FULL_GRAPH


# -- one decoder per batch-size bucket ---------------------------------------------------------
def bucketed(m: Transducer, be: FakeBackend, **kw: Any) -> BucketedGraphDecoder:
    return BucketedGraphDecoder(m.decoder, m.joint, m.dims.blank_id, backend=be, **kw)


def test_bucketed_decoder_equals_reference_and_captures_once_per_bucket() -> None:
    m, be = trained_like(), FakeBackend()
    d = bucketed(m, be, per_octave=2)
    a, b = simulate([reference(m), d], m, slots=11, chunks=30, seed=11)
    assert a == b and n_labels(a) > 50
    sizes = sorted(d.buckets)
    assert sizes and set(sizes) <= {1, 2, 3, 4, 6, 8, 12} and len(be.captures) == len(sizes)
    assert all(dec.max_batch == size for size, dec in d.buckets.items()) and d.mode == FULL_GRAPH
    assert d.rebuilds == len(sizes)


@pytest.mark.usefixtures("exact_buckets")
def test_spaced_captures_replay_a_captured_bucket_of_at_most_twice_the_rows() -> None:
    """With `capture_spacing_s`, a size without graphs soon after a capture replays a captured
    bucket of at most twice its rows (7 rows: the graphs of 12), the same labels as the reference;
    with none that large enough it captures (5 rows: 12 > 10), and only then."""
    m, be = trained_like(), FakeBackend()
    d, ref = bucketed(m, be, per_octave=2), reference(m)
    d.capture_spacing_s = 60.0
    rng = np.random.default_rng(4)
    captures, modes = [], []
    for b in (12, 7, 5, 7):
        enc = torch.from_numpy(rng.standard_normal((b, 7, m.dims.d_model)).astype(np.float32))
        lengths = torch.full((b,), 7)
        assert d(enc, lengths)[0].to_lists() == ref(enc, lengths)[0].to_lists()
        captures.append(len(be.captures))
        modes.append(d.mode)
    assert captures == [1, 1, 2, 2] and d.captured() == [6, 12] and FULL_GRAPH in modes and EAGER not in modes
    assert sorted(d.used_at) == [6, 8, 12]  # the sizes called, captured or not (a migration prepares them)


@pytest.mark.usefixtures("exact_buckets")
def test_held_captures_replay_a_larger_bucket_or_decode_eagerly() -> None:
    """While captures are held (a move is prepared), a size without graphs replays a captured
    bucket of at most twice its rows (7 rows: the graphs of 12) or, with none, decodes eagerly (5
    and 20 rows) and captures nothing: the same labels as the reference. Released, it captures."""
    m, be = trained_like(), FakeBackend()
    d, ref = bucketed(m, be, per_octave=2), reference(m)
    rng = np.random.default_rng(5)
    captures, modes, reasons = [], [], []
    for b, hold in ((12, False), (7, True), (5, True), (20, True), (5, False)):
        d.hold_captures = hold
        enc = torch.from_numpy(rng.standard_normal((b, 7, m.dims.d_model)).astype(np.float32))
        lengths = torch.full((b,), 7)
        assert d(enc, lengths)[0].to_lists() == ref(enc, lengths)[0].to_lists()
        captures.append(len(be.captures))
        modes.append(d.mode)
        reasons.append(d.eager_reason)
    assert captures == [1, 1, 1, 1, 2] and d.captured() == [6, 12]
    assert modes == [FULL_GRAPH, FULL_GRAPH, EAGER, EAGER, FULL_GRAPH]
    assert reasons == ["", "", HELD, HELD, ""]


def test_bucketed_decoder_rebuilds_each_bucket_after_a_cast() -> None:
    m, be = trained_like(), FakeBackend()
    d, ref = bucketed(m, be), reference(m)
    steps = {8: lambda: m.to(torch.bfloat16), 16: lambda: m.to(torch.float32)}
    a, b = simulate([ref, d], m, slots=6, chunks=24, seed=12, between=lambda s: steps.get(s, lambda: None)())
    assert a == b
    assert all(dec.key is not None and dec.key.dtype == torch.float32 for dec in d.buckets.values())
    assert d.initial_state(2).h.dtype == torch.float32
    d.reset()
    assert all(dec.key is None for dec in d.buckets.values())


def test_make_decoder_with_buckets() -> None:
    m = trained_like()
    d = make_decoder(m, "graphs", per_octave=4)
    assert isinstance(d, BucketedGraphDecoder) and d.requested == NO_WHILE_LOOPS and d.per_octave == 4
    if not torch.cuda.is_available():
        assert type(make_decoder(m, "auto", per_octave=4)) is GreedyLabelLooping
    with pytest.raises(ValueError):
        make_decoder(m, "graphs", per_octave=3)


def test_the_shared_pool_takes_a_fresh_id_once_its_last_graphs_are_released(monkeypatch: pytest.MonkeyPatch) -> None:
    """The buckets' shared pool keeps its id while any bucket's graphs live, and takes a fresh
    one when the last are released (torch keeps an unused pool under its id in the pinned-host
    allocator, and a capture into that id fails): the bookkeeping, with the CUDA calls faked."""
    from itertools import count

    from streamd.decoding import graphs

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", count().__next__)
    monkeypatch.setattr(graphs.CudaGraphBackend, "capture", lambda self, device, steps, warmup: {})
    monkeypatch.setattr(graphs.CudaGraphBackend, "release", lambda self, device: None)
    backend, dev = graphs.SharedPoolBackend(), torch.device("cuda", 0)
    first = backend.pool(dev).handle
    for _ in range(2):  # two buckets' graphs in the pool
        backend.capture(dev, {}, lambda: None)
    backend.release(dev)
    assert backend.pool(dev).handle == first  # the other bucket's graphs still use it
    backend.release(dev)
    second = backend.pool(dev).handle
    assert second != first  # none left: the next capture goes into a fresh id
    backend.capture(dev, {}, lambda: None)
    assert backend.pool(dev).handle == second
