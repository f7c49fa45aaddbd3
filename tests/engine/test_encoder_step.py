"""The encoder step's CUDA-graph bookkeeping, on the CPU: capture is replaced by a fake backend
whose "graphs" call the captured step function on the static buffers, so everything but the CUDA
calls (buckets, keys, lazy re-capture, static buffers, padding, copy-in and copy-out, fallbacks)
runs here and is compared with the eager step."""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch

from helpers import random_model, run_streams, synthetic_audio
from streamd import buckets
from streamd.buckets import bucket_size
from streamd.decoding.greedy import GreedyLabelLooping
from streamd.engine.encoder_step import EAGER, GRAPHS, EncoderGraphBackend, EncoderGraphKey, EncoderStep
from streamd.engine.recognizer import Recognizer
from streamd.engine.types import ChunkGeometry
from streamd.model.attention import RelPositionMultiHeadAttention
from streamd.model.encoder import EncoderCache, read_rings, write_chunk
from streamd.model.transducer import Transducer

CONTEXT = ((16, 3),)


class FakeGraph:
    def __init__(self, backend: FakeBackend, fn: Any) -> None:
        self.backend, self.fn, self.views = backend, fn, fn.args[0]

    def replay(self) -> None:
        self.backend.replays += 1
        p = self.backend.poison_from
        if p is not None:  # garbage in every padded row: it must not reach the real ones
            v = self.views
            for t in (v.mel, v.cache.channel.transpose(0, 1), v.cache.time.transpose(0, 1)):
                t[p:] = float("nan")
            v.lengths[p:], v.start[p:], v.cache.channel_len[p:] = 7, 8, 3
            if v.cache.head is not None:
                v.cache.head[p:] = 5
        self.fn()


class FakeBackend(EncoderGraphBackend):
    """Graphs for the CPU: capture warms up once and returns a graph that calls the function."""

    def __init__(self, fail_sizes: tuple[int, ...] = ()) -> None:
        self.captures: list[int] = []  # bucket sizes, in capture order
        self.releases = 0
        self.replays = 0
        self.fail_sizes = fail_sizes
        self.poison_from: int | None = None

    def supports(self, device: torch.device) -> bool:
        return True

    def new_pool(self, device: torch.device) -> Any:
        return None

    def capture(self, device: torch.device, fn: Any, pool: Any) -> FakeGraph:
        size = int(fn.args[0].rows.shape[0])
        if size in self.fail_sizes:
            raise RuntimeError("operation not permitted when stream is capturing")
        fn()
        self.captures.append(size)
        return FakeGraph(self, fn)

    def release(self, device: torch.device) -> None:
        self.releases += 1


def model(seed: int = 3, **kw: Any) -> Transducer:
    return random_model(seed, att_context_sizes=CONTEXT, **kw)


def graph_step(m: Transducer, backend: Any = None, **kw: Any) -> EncoderStep:
    return EncoderStep(m.encoder, "graphs", backend=backend if backend is not None else FakeBackend(), **kw)


def inputs(m: Transducer, b: int, rng: np.random.Generator, ragged: bool = True
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """b random windows: mel (b, n_mels, W) on the CPU, lengths and start (b,) on the model's
    device (as the recognizer passes them); some rows start late (a stream's first step) or end
    early (its last)."""
    w = ChunkGeometry.of(m.dims, CONTEXT[0][1]).window
    mel = torch.from_numpy(rng.standard_normal((b, m.dims.features.n_mels, w)).astype(np.float32))
    start = np.where(rng.random(b) < 0.3, rng.choice([8, 16], b), 0) if ragged else np.zeros(b, dtype=np.int64)
    lengths = np.where(rng.random(b) < 0.3, rng.integers(start + 1, w + 1), w) if ragged else np.full(b, w)
    full = bool((start == 0).all() and (lengths == w).all())
    return mel, torch.from_numpy(lengths).long().to(m.device), torch.from_numpy(start).long().to(m.device), full


def simulate(steps: list[EncoderStep], m: Transducer, slots: int, chunks: int, seed: int,
             sizes: tuple[int, ...] | None = None, between: Any = None, kv: bool | list[bool] = True
             ) -> tuple[list[list[tuple[torch.Tensor, torch.Tensor]]], list[EncoderCache]]:
    """Each step function keeps its own slot state (in the cache layout `kv`, one for all or one
    each); every chunk encodes a random subset of the slots (in random order) or `sizes[chunk]`
    of them. Returns each one's outputs per chunk and its final slot state."""
    rng = np.random.default_rng(seed)
    layouts = kv if isinstance(kv, list) else [kv] * len(steps)
    caches = [m.encoder.init_cache(slots, CONTEXT[0], m.device, m.dtype, kv=k, ring=True) for k in layouts]
    outs: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in steps]
    for chunk in range(chunks):
        if between is not None:
            between(chunk)
        b = sizes[chunk] if sizes is not None else int(rng.integers(1, slots + 1))
        rows = torch.from_numpy(rng.permutation(slots)[:b]).to(m.device)
        mel, lengths, start, full = inputs(m, b, rng, ragged=chunk % 3 != 0)
        for k, (step, cache) in enumerate(zip(steps, caches)):
            if cache.channel.dtype != m.dtype:
                caches[k] = cache = cache.to(m.device, m.dtype)
            enc, enc_len = step(cache, rows, mel, lengths, start, full, att_context=CONTEXT[0])
            outs[k].append((enc, enc_len))
    return outs, caches


def _copy(cache: EncoderCache) -> EncoderCache:
    """The same slot state in new storage."""
    return EncoderCache(cache.channel.clone(), cache.time.clone(), cache.channel_len.clone(), cache.kv,
                        None if cache.head is None else cache.head.clone())


def assert_same(a: tuple[list, list[EncoderCache]], b: tuple[list, list[EncoderCache]], k: int = 1) -> None:
    """Outputs and slot state of step function 0 of `a` against step function `k` of `b`."""
    (outs_a, caches_a), (outs_b, caches_b) = a, b
    assert len(outs_a[0]) == len(outs_b[k])
    for (ea, la), (eb, lb) in zip(outs_a[0], outs_b[k]):
        assert torch.equal(la, lb)
        torch.testing.assert_close(ea, eb, rtol=1e-5, atol=1e-5)
    ca, cb = caches_a[0], caches_b[k]
    assert torch.equal(ca.channel_len, cb.channel_len)
    torch.testing.assert_close(ca.channel, cb.channel, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ca.time, cb.time, rtol=1e-5, atol=1e-5)


# -- buckets and keys --------------------------------------------------------------------------
def test_bucket_sizes() -> None:
    assert [bucket_size(b) for b in (1, 2, 3, 5, 8, 9, 16, 17, 19, 2048, 2049, 2400, 6500)] == \
        [1, 2, 4, 8, 8, 9, 16, 18, 20, 2048, 2304, 2560, 6656]
    assert [bucket_size(b, 1) for b in (1, 3, 5, 100)] == [1, 4, 8, 128]
    for per_octave in (1, 4, 8, 16):
        sizes = [bucket_size(b, per_octave) for b in range(1, 5000)]
        assert all(s >= b for b, s in enumerate(sizes, 1)) and sizes == sorted(sizes)
        assert all((s - b) * per_octave < b for b, s in enumerate(sizes, 1) if b > per_octave)
        assert all(bucket_size(s, per_octave) == s for s in sizes)
    with pytest.raises(ValueError):
        EncoderStep(model().encoder, per_octave=6)
    with pytest.raises(ValueError):
        EncoderStep(model().encoder, mode="fast")


def _key(**kw: Any) -> EncoderGraphKey:
    base: dict[str, Any] = {"device": torch.device("cuda", 0), "dtype": torch.float32, "weights": (1, 2),
                            "att_context": (70, 13), "window": (80, 121)}
    base.update(kw)
    return EncoderGraphKey(**base)


def test_key_changes_name_every_difference() -> None:
    k = _key()
    assert k.changes_from(_key()) == "" and k.changes_from(None) == "first call"
    assert "device cuda:1 -> cuda:0" in k.changes_from(_key(device=torch.device("cuda", 1)))
    assert "dtype torch.bfloat16 -> torch.float32" in k.changes_from(_key(dtype=torch.bfloat16))
    assert "weight storage replaced" in k.changes_from(_key(weights=(1, 3)))
    assert "attention context [70, 1] -> [70, 13]" in k.changes_from(_key(att_context=(70, 1)))
    assert "mel window (80, 25) -> (80, 121)" in k.changes_from(_key(window=(80, 25)))
    assert "cache layout inputs -> keys/values" in k.changes_from(_key(kv=False))
    in_place = _key(rings=(7, 64, 70, 1024))
    assert "slot rings read in place" in in_place.changes_from(k)
    assert "slot rings gathered" in k.changes_from(in_place)
    assert "slot storage replaced" in in_place.changes_from(_key(rings=(9, 64, 70, 1024)))


def test_current_key_reads_the_model() -> None:
    m = model()
    step = graph_step(m)
    mel = torch.zeros(2, m.dims.features.n_mels, 41)
    k = step.current_key(mel, CONTEXT[0])
    assert (k.device, k.dtype, k.att_context, k.window) == (torch.device("cpu"), torch.float32, (16, 3),
                                                            (m.dims.features.n_mels, 41))
    assert sorted(k.weights) == sorted(t.data_ptr() for t in (*m.encoder.parameters(), *m.encoder.buffers()))
    m.to(torch.bfloat16)
    k2 = step.current_key(mel, CONTEXT[0])
    assert k2.dtype == torch.bfloat16 and k2.weights != k.weights


# -- capture, reuse, parity --------------------------------------------------------------------
def test_nothing_before_the_first_call_then_one_capture_per_bucket() -> None:
    m, be = model(), FakeBackend()
    step = graph_step(m, be)
    assert step.key is None and step.static_rows == 0 and step.mode == EAGER
    simulate([step], m, slots=12, chunks=10, seed=0, sizes=(5, 6, 7, 8, 5, 3, 9, 12, 3, 8))
    assert be.captures == [8, 4, 9, 12] and be.replays == 10 and step.mode == GRAPHS
    assert step.buckets == [4, 8, 9, 12] and step.static_rows == 64
    assert step.rebuilds == 1 and step.last_rebuild_reason == "first call"


def test_while_held_a_size_without_a_graph_runs_eagerly_and_the_rest_replay() -> None:
    """While a move is prepared (`hold_captures`) the step captures nothing: a batch size with a
    graph replays it, one without runs eagerly (the same outputs) and says why; once the hold
    ends, the next call of that size captures it."""
    m, be = model(), FakeBackend()
    step = graph_step(m, be)
    eager = EncoderStep(m.encoder, EAGER)

    def held(chunk: int) -> None:  # before each chunk's step
        if chunk == 4:  # chunk 3 ran held
            assert step.mode == EAGER and "a move is being prepared" in step.eager_reason
        step.hold_captures = 2 <= chunk < 4

    got = simulate([step, eager], m, slots=12, chunks=5, seed=0, sizes=(8, 8, 8, 12, 12), between=held)
    assert_same(got, got)
    assert be.captures == [8, 12] and be.replays == 4  # size 12: eager at chunk 3, captured at chunk 4
    assert step.mode == GRAPHS and step.eager_reason == ""


def test_spaced_captures_leave_the_sizes_in_between_eager() -> None:
    """With `capture_spacing_s`, a call captures at most one graph in that long: a new size
    soon after a capture runs eagerly (the same outputs) and says why; captured sizes replay."""
    m, be = model(), FakeBackend()
    step = graph_step(m, be)
    step.capture_spacing_s = 60.0
    eager = EncoderStep(m.encoder, EAGER)
    modes = []

    def spacing(chunk: int) -> None:  # before each chunk's step
        if chunk:
            modes.append((step.mode, step.eager_reason))
        if chunk == 3:
            step.capture_spacing_s = 0.0  # as if the time had passed

    got = simulate([step, eager], m, slots=12, chunks=4, seed=0, sizes=(8, 12, 8, 12), between=spacing)
    assert_same(got, got)
    assert be.captures == [8, 12] and be.replays == 3
    assert modes[0] == (GRAPHS, "") and modes[2] == (GRAPHS, "")
    assert modes[1][0] == EAGER and "captured under 60.0 s ago" in modes[1][1]



@pytest.mark.usefixtures("exact_buckets")
def test_a_size_without_a_graph_replays_a_captured_bucket_of_at_most_twice_its_rows() -> None:
    """Captures held (or spaced, or failed): a batch of 7 replays the captured bucket of 12,
    padded (the same outputs as eager); a batch of 5 (12 > 2 x 5) runs eagerly."""
    m, be = model(), FakeBackend()
    step = graph_step(m, be)
    eager = EncoderStep(m.encoder, EAGER)
    modes = []

    def held(chunk: int) -> None:  # before each chunk's step
        if chunk:
            modes.append(step.mode)
        step.hold_captures = chunk > 0

    got = simulate([step, eager], m, slots=12, chunks=4, seed=0, sizes=(12, 7, 5, 7), between=held)
    assert_same(got, got)
    modes.append(step.mode)
    assert be.captures == [12] and be.replays == 3
    assert modes == [GRAPHS, GRAPHS, EAGER, GRAPHS]

def test_a_moves_target_replays_a_near_bucket_instead_of_capturing(monkeypatch: pytest.MonkeyPatch) -> None:
    """With captures spaced (a move's target, the spacing past), a batch of 15 rows (bucket 16)
    replays the captured bucket of 20 (at most NEAR_PADDING x its bucket: the sizes a move
    prepares are a cover of buckets) instead of capturing its own; one of 9 (bucket 10) captures."""
    monkeypatch.setattr(buckets, "PAD_ROWS", 1)
    m, be = model(), FakeBackend()
    step = graph_step(m, be, per_octave=4)
    eager = EncoderStep(m.encoder, EAGER)
    modes = []

    def spaced(chunk: int) -> None:  # before each chunk's step
        if chunk:
            modes.append((step.mode, step.padded))
        step.capture_spacing_s = 1e-9 if chunk else 0.0

    got = simulate([step, eager], m, slots=20, chunks=4, seed=0, sizes=(20, 15, 15, 9), between=spaced)
    assert_same(got, got)
    modes.append((step.mode, step.padded))
    assert be.captures == [20, 10] and modes == [(GRAPHS, False), (GRAPHS, True), (GRAPHS, True), (GRAPHS, False)]


@pytest.mark.parametrize("kv", [True, False], ids=["kv_cache", "input_cache"])
@pytest.mark.parametrize("per_octave", [1, 8])
def test_fake_graphs_equal_eager_with_ragged_windows_and_random_rows(per_octave: int, kv: bool) -> None:
    m = model()
    eager = EncoderStep(m.encoder, EAGER)
    graphs = graph_step(m, per_octave=per_octave)
    got = simulate([eager, graphs], m, slots=23, chunks=24, seed=1, kv=kv)
    assert_same(got, got)
    assert graphs.mode == GRAPHS and eager.mode == EAGER and eager.key is None
    assert graphs.key is not None and graphs.key.kv == kv and got[1][1].kv == kv
    assert graphs._static is not None and graphs._static.shapes["windows"][2] == m.dims.d_model * (2 if kv else 1)


def test_with_the_attention_kernel_graphs_read_the_slot_rings_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the attention kernel runs (here in Triton's interpreter), a graph's windows hold only
    the chunk's frames and the kernel reads the cached keys and values from the slot rings in
    place (the key names the rings' storage): the same outputs and slot state as the eager step
    on the reference path (which gathers them) and as the eager step on the kernel (in place
    too). An input cache (NeMo's layout) still gathers its windows. Graphs prepared ahead over a
    staged slot state (a migration's) serve calls over that state without capturing again."""
    pytest.importorskip("triton")
    m = model(d_model=32, n_heads=2)  # heads of 16: the kernel's smallest

    def kernel(on: bool, step: EncoderStep) -> Any:
        def call(*args: Any, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
            monkeypatch.setattr(RelPositionMultiHeadAttention, "kernel", on)
            return step(*args, **kw)
        return call

    steps = [EncoderStep(m.encoder, EAGER), graph_step(m), EncoderStep(m.encoder, EAGER), graph_step(m)]
    got = simulate([kernel(on, s) for on, s in zip((False, True, True, True), steps)], m, slots=6, chunks=4,
                   seed=4, kv=[True, True, True, False])
    for k in (1, 2):
        assert_same(got, got, k)
    for (ea, la), (eb, lb) in zip(got[0][0], got[0][3]):
        assert torch.equal(la, lb)
        torch.testing.assert_close(eb, ea, rtol=1e-5, atol=1e-5)
    in_place, gathered = steps[1], steps[3]
    t = got[0][0][0][0].shape[1]
    rings = got[1][1].channel
    assert in_place.key is not None and in_place.key.rings == (rings.data_ptr(), *rings.shape)
    assert in_place._static is not None and in_place._static.shapes["windows"][1] == t
    assert gathered.key is not None and gathered.key.rings == ()
    assert gathered._static is not None and gathered._static.shapes["windows"][1] == CONTEXT[0][0] + t

    # A migration's target captures ahead over the slot state staged for it: its first call
    # over that state replays what it captured, and gives the reference's output.
    staged, mine = _copy(got[1][1]), _copy(got[1][1])
    mel, lengths, start, full = inputs(m, 4, np.random.default_rng(5))
    ahead, rows = graph_step(m), torch.tensor([5, 0, 2, 3])
    monkeypatch.setattr(RelPositionMultiHeadAttention, "kernel", True)
    assert ahead.prepare([4], (mel.shape[1], mel.shape[2]), CONTEXT[0], slots=staged) == [4]
    assert ahead.key is not None and ahead.key.rings == (staged.channel.data_ptr(), *staged.channel.shape)
    enc, _ = ahead(staged, rows, mel, lengths, start, full, att_context=CONTEXT[0])
    assert ahead.mode == GRAPHS and ahead.captures == 1
    want, _ = kernel(False, EncoderStep(m.encoder, EAGER))(mine, rows, mel, lengths, start, full,
                                                           att_context=CONTEXT[0])
    torch.testing.assert_close(enc, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(staged.channel, mine.channel, rtol=1e-5, atol=1e-5)


def test_both_cache_layouts_give_the_same_outputs() -> None:
    """The key/value cache is the input cache's computation with the cached frames' projections
    kept: the same encoder outputs, through graphs and eagerly, with ragged windows and random
    slots; its keys and values are the projections of the input cache's frames."""
    m = model()
    steps = [EncoderStep(m.encoder, EAGER), graph_step(m), EncoderStep(m.encoder, EAGER)]
    outs, caches = simulate(steps, m, slots=9, chunks=16, seed=10, kv=[False, True, True])
    for k in (1, 2):
        for (ea, la), (eb, lb) in zip(outs[0], outs[k]):
            assert torch.equal(la, lb)
            torch.testing.assert_close(eb, ea, rtol=1e-5, atol=1e-5)
    inputs_, kv = caches[0], caches[1]
    assert torch.equal(inputs_.channel_len, kv.channel_len) and bool((kv.channel_len == 16).all())
    with torch.no_grad():
        want = torch.stack([torch.cat([layer.self_attn.linear_k(ch), layer.self_attn.linear_v(ch)], -1)
                            for layer, ch in zip(m.encoder.layers, inputs_.channel)])
    torch.testing.assert_close(kv.channel, want, rtol=1e-5, atol=1e-5)


def test_the_eager_step_keeps_its_attention_windows_between_steps_on_the_cpu() -> None:
    """On a CPU the eager step reads the slots straight into windows allocated once (a fresh
    block of tens of MB is mapped and faulted in on every step: with the key/value cache's
    doubled bytes the default model's step was slower than the input cache's), and still equals
    the graphs' gather, step and scatter."""
    m = model()
    eager, storages = EncoderStep(m.encoder, EAGER), []
    take = eager._work.take

    def spy(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        t = take(shape, like)
        storages.append(t.untyped_storage().data_ptr())
        return t

    eager._work.take = spy  # type: ignore[method-assign]
    got = simulate([graph_step(m), eager], m, slots=8, chunks=6, seed=4, sizes=(8, 3, 8, 5, 8, 1))
    assert_same(got, got)
    assert len(storages) == 6 and len(set(storages)) == 1


def test_one_step_serves_both_layouts_capturing_again_on_a_change() -> None:
    m, be = model(), FakeBackend()
    step = graph_step(m, be)
    simulate([step], m, slots=4, chunks=1, seed=11, sizes=(3,), kv=False)
    simulate([step], m, slots=4, chunks=1, seed=11, sizes=(3,), kv=True)
    assert be.captures == [4, 4] and step.rebuilds == 2
    assert step.last_rebuild_reason == "cache layout inputs -> keys/values"


def test_padded_rows_never_reach_real_rows() -> None:
    m, be = model(), FakeBackend()
    graphs, eager = graph_step(m, be), EncoderStep(m.encoder, EAGER)
    sizes = (5, 3, 19, 1, 7, 33, 2)
    want = simulate([eager], m, slots=33, chunks=len(sizes), seed=2, sizes=sizes)

    def poison(chunk: int) -> None:
        be.poison_from = sizes[chunk]

    got = simulate([graphs], m, slots=33, chunks=len(sizes), seed=2, sizes=sizes, between=poison)
    assert_same(want, got, k=0)
    assert all(torch.isfinite(e).all() for e, _ in got[0][0])
    assert be.captures == [8, 4, 20, 1, 36, 2] and be.replays == len(sizes)


def test_outputs_are_fresh_tensors() -> None:
    m = model()
    step = graph_step(m)
    rng = np.random.default_rng(0)
    cache = m.encoder.init_cache(4, CONTEXT[0], m.device, m.dtype, ring=True)
    enc, enc_len = step(cache, torch.tensor([2, 0, 3]), *inputs(m, 3, rng), att_context=CONTEXT[0])
    static = step._static
    assert enc.shape == (3, 4, m.dims.d_model) and enc_len.shape == (3,)
    for t in (enc, enc_len):
        for buf in (static.enc, static.enc_len, static.windows):
            assert t.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()


def test_recognizer_with_fake_graphs_equals_eager_across_dtype_moves() -> None:
    """Tokens through the whole pipeline, streams joining and leaving, the model cast to bf16 and
    back between steps (no notification): each cast re-captures."""
    audios = [synthetic_audio(s, i) for i, s in enumerate([0.6, 2.2, 1.4, 1.9, 1.1])]
    starts = [0, 2, 3, 9, 4]

    def run(make: Any) -> list:
        m = model()  # fresh: the bf16 trip rounds the weights
        moves = {6: lambda: m.to(torch.bfloat16), 14: lambda: m.to(torch.float32)}
        dec = GreedyLabelLooping(m.decoder, m.joint, m.dims.blank_id)
        return run_streams(m, dec, audios, starts, events=moves, encoder=make(m))[0]

    be = FakeBackend()
    steps: list[EncoderStep] = []
    want = run(lambda m: EncoderStep(m.encoder, EAGER))
    got = run(lambda m: steps.append(graph_step(m, be)) or steps[-1])
    assert got == want and sum(len(t) for t, _ in want) > 0
    step = steps[0]
    assert step.rebuilds == 3 and step.key is not None and step.key.dtype == torch.float32
    assert "dtype torch.bfloat16 -> torch.float32" in step.last_rebuild_reason
    assert be.releases == 2 and be.replays > 10


# -- rebuilds ----------------------------------------------------------------------------------
def test_replaced_weight_storage_recaptures_and_in_place_updates_do_not() -> None:
    m, other = model(3), model(5)
    be = FakeBackend()
    eager, graphs = EncoderStep(m.encoder, EAGER), graph_step(m, be)

    def swap(chunk: int) -> None:
        if chunk == 4:
            m.load_state_dict(other.state_dict())  # in place: same storage, new values
        if chunk == 8:
            m.load_state_dict(model(7).state_dict(), assign=True)

    got = simulate([eager, graphs], m, slots=6, chunks=12, seed=3, sizes=(6,) * 12, between=swap)
    assert_same(got, got)
    assert be.captures == [8, 8] and graphs.rebuilds == 2
    assert graphs.last_rebuild_reason == "weight storage replaced"


def test_static_buffers_for_max_batch_at_once_so_no_growth_drops_graphs() -> None:
    m, be = model(), FakeBackend()
    step = graph_step(m, be, max_batch=300)
    simulate([step], m, slots=300, chunks=5, seed=4, sizes=(3, 5, 70, 130, 300))
    assert step.static_rows == 320 and be.captures == [4, 8, 72, 144, 320]
    assert be.releases == 0 and step.buckets == [4, 8, 72, 144, 320]


def test_without_max_batch_static_buffers_grow_by_doubling() -> None:
    m, be = model(), FakeBackend()
    step = graph_step(m, be)
    simulate([step], m, slots=300, chunks=4, seed=4, sizes=(3, 70, 130, 300))
    assert step.static_rows == 512 and be.captures == [4, 72, 144, 320]
    assert be.releases == 3  # each growth (64 -> 128 -> 256 -> 512 rows) dropped every graph
    assert step.buckets == [320]


def test_reset_drops_everything() -> None:
    m, be = model(), FakeBackend()
    step = graph_step(m, be)
    simulate([step], m, slots=4, chunks=2, seed=5, sizes=(3, 4))
    step.reset()
    assert step.key is None and step.buckets == [] and step.static_rows == 0 and be.releases == 1
    simulate([step], m, slots=4, chunks=1, seed=5, sizes=(3,))
    assert be.captures == [4, 4]


def test_the_calls_attention_context_is_part_of_the_key() -> None:
    """The context is the caller's argument, not a model attribute: a call with another one
    re-captures, with static caches of its left context, and matches the eager step."""
    m, be = random_model(3, att_context_sizes=((16, 3), (8, 1))), FakeBackend()
    eager, graphs = EncoderStep(m.encoder, EAGER), graph_step(m, be)
    rng = np.random.default_rng(9)
    rows = torch.tensor([2, 0, 3])
    for context in ((16, 3), (8, 1), (16, 3)):
        caches = [m.encoder.init_cache(4, context, m.device, m.dtype, ring=True) for _ in range(2)]
        w = ChunkGeometry.of(m.dims, context[1]).window
        mel = torch.from_numpy(rng.standard_normal((3, m.dims.features.n_mels, w)).astype(np.float32))
        lengths, start = torch.full((3,), w), torch.zeros(3, dtype=torch.long)
        (e0, l0), (e1, l1) = (step(c, rows, mel, lengths, start, att_context=context)
                              for step, c in zip((eager, graphs), caches))
        assert torch.equal(l0, l1) and graphs.mode == GRAPHS
        torch.testing.assert_close(e0, e1, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(caches[0].channel, caches[1].channel, rtol=1e-5, atol=1e-5)
        assert graphs._static is not None
        assert graphs._static.shapes["windows"][1] == context[0] + graphs._static.shapes["enc"][0]
    assert graphs.rebuilds == 3 and be.captures == [4, 4, 4]
    assert "attention context [8, 1] -> [16, 3]" in graphs.last_rebuild_reason


# -- fallbacks ---------------------------------------------------------------------------------
def test_failed_capture_runs_that_bucket_eagerly_until_the_key_changes(caplog: pytest.LogCaptureFixture) -> None:
    m = model()
    be, reasons = FakeBackend(fail_sizes=(8,)), []
    eager, graphs = EncoderStep(m.encoder, EAGER), graph_step(m, be, on_fallback=reasons.append)
    sizes = (7, 3, 8, 5, 4)
    with caplog.at_level(logging.WARNING, "streamd.engine"):
        got = simulate([eager, graphs], m, slots=8, chunks=len(sizes), seed=6, sizes=sizes)
    assert_same(got, got)
    assert be.captures == [4] and graphs.buckets == [4] and graphs.fallbacks == 1
    assert len(reasons) == 1 and "capture failed for batch 8" in reasons[0] and "capture failed" in caplog.text
    graphs(m.encoder.init_cache(8, CONTEXT[0], m.device, m.dtype, ring=True), torch.arange(6),
           *inputs(m, 6, np.random.default_rng(0)), att_context=CONTEXT[0])
    assert graphs.mode == EAGER and graphs.fallbacks == 1  # not tried again
    m.to(torch.float64)
    be.fail_sizes = ()
    simulate([graphs], m, slots=8, chunks=1, seed=6, sizes=(6,))
    assert be.captures == [4, 8] and graphs.mode == GRAPHS  # a new key is tried again


def test_eager_requests_the_cpu_and_training_never_capture() -> None:
    m = model()
    be = FakeBackend()
    cpu_real = EncoderStep(m.encoder, "auto")  # the real backend: no graphs on the CPU
    never = EncoderStep(m.encoder, EAGER, backend=be)
    eager = EncoderStep(m.encoder, EAGER)
    got = simulate([eager, cpu_real, never], m, slots=5, chunks=6, seed=7)
    assert_same(got, got, k=1)
    assert_same(got, got, k=2)
    assert be.captures == [] and cpu_real.key is None and cpu_real.mode == EAGER
    m.train()
    training = graph_step(m, be)
    simulate([training], m, slots=3, chunks=2, seed=7)
    assert be.captures == [] and training.mode == EAGER


def test_a_callers_inference_mode_and_autocast_do_not_reach_the_buffers() -> None:
    m = model()
    step = graph_step(m)
    rng = np.random.default_rng(8)
    cache = m.encoder.init_cache(4, CONTEXT[0], m.device, m.dtype, ring=True)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        step(cache, torch.tensor([0, 1]), *inputs(m, 2, rng), att_context=CONTEXT[0])
    static = step._static
    assert static is not None and not static.windows.is_inference() and static.enc.dtype == torch.float32
    # buffers made in inference mode would refuse this:
    step(cache, torch.tensor([2, 3]), *inputs(m, 2, rng), att_context=CONTEXT[0])


def test_recognizer_makes_an_encoder_step_per_model() -> None:
    m = model()
    made: list[EncoderStep] = []
    rec = Recognizer(m, capacity=2, encoder_factory=lambda mm: made.append(graph_step(mm)) or made[-1])
    target = model()
    rec.use_model(target)
    assert [s.encoder for s in made] == [m.encoder, target.encoder] and rec.encoder_step is made[1]


@pytest.mark.parametrize("kv", [True, False])
@pytest.mark.parametrize("fused", [False, True])
def test_rings_give_the_outputs_and_caches_of_time_order(kv: bool, fused: bool) -> None:
    """Slot storage keeps each channel cache as a ring and writes back only a step's chunk: over
    many steps (the rings wrap again and again, streams start at different steps, so their heads
    differ), each stream's outputs equal those of the same stream stepped on its own in time
    order (NeMo's layout), and its ring read from its head is the time-order cache. Both cache
    layouts, both attention paths (the fused one is CUDA's)."""
    m = model()
    c, slots = CONTEXT[0][0], 3
    rng = np.random.default_rng(4)
    ring = m.encoder.init_cache(slots, CONTEXT[0], m.device, m.dtype, kv=kv, ring=True)
    alone = [m.encoder.init_cache(1, CONTEXT[0], m.device, m.dtype, kv=kv) for _ in range(slots)]
    for layer in m.encoder.layers:
        layer.self_attn.fused = fused
    try:
        with torch.no_grad():
            for step in range(11):
                rows = [r for r in range(slots) if step >= 2 * r]  # slot r joins at step 2r
                mel, lengths, start, _ = inputs(m, len(rows), rng, ragged=False)
                x, x_len, _ = m.encoder.streaming_forward(mel, lengths, ring, CONTEXT[0], start=start,
                                                          rows=torch.tensor(rows))
                for i, r in enumerate(rows):
                    y, y_len, alone[r] = m.encoder.streaming_forward(mel[i:i + 1], lengths[i:i + 1], alone[r],
                                                                     CONTEXT[0], start=start[i:i + 1])
                    assert torch.equal(x_len[i:i + 1], y_len)
                    torch.testing.assert_close(x[i:i + 1], y, rtol=1e-5, atol=1e-5)
    finally:
        for layer in m.encoder.layers:
            layer.self_attn.fused = None
    assert ring.head is not None and ring.head.tolist() == [(11 - 2 * r) * 4 % c for r in range(slots)]
    assert len(set(ring.head.tolist())) > 1  # the rings are not all aligned
    for r in range(slots):
        in_time = torch.roll(ring.channel[:, r], -int(ring.head[r]), dims=1)
        torch.testing.assert_close(in_time, alone[r].channel[:, 0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ring.time[:, r], alone[r].time[:, 0], rtol=1e-5, atol=1e-5)
        assert int(ring.channel_len[r]) == int(alone[r].channel_len[0])


def test_rings_without_left_context_keep_nothing() -> None:
    """A model trained with no left context (att_context [0, 1], which checkpoints may declare):
    rings of no frames, stepped as time order is."""
    ctx = (0, 1)
    m = random_model(3, att_context_sizes=(ctx,))
    w = ChunkGeometry.of(m.dims, ctx[1]).window
    ring = m.encoder.init_cache(2, ctx, m.device, m.dtype, ring=True)
    alone = m.encoder.init_cache(2, ctx, m.device, m.dtype)
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for _ in range(3):
            mel = torch.from_numpy(rng.standard_normal((2, m.dims.features.n_mels, w)).astype(np.float32))
            x, _, _ = m.encoder.streaming_forward(mel, torch.full((2,), w), ring, ctx, rows=torch.arange(2))
            y, _, alone = m.encoder.streaming_forward(mel, torch.full((2,), w), alone, ctx)
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    assert ring.head is not None and ring.head.tolist() == [0, 0] and ring.channel.shape[2] == 0


@pytest.mark.parametrize("c", [5, 0])
def test_rings_read_one_layer_at_a_time_as_in_one_call(c: int) -> None:
    """`read_rings`' two ways (one index_select over the 4-D view: the CPU's; one a layer: the
    GPU's) fill the windows' first C frames alike, rows in any order and repeated (the padded
    rows of a bucket), and leave the chunk's frames after them alone."""
    g = torch.Generator().manual_seed(0)
    channel = torch.randn(3, 7, c, 4, generator=g)
    rows = torch.tensor([6, 0, 3, 3])
    got = {}
    for per_layer in (False, True):
        windows = torch.full((3, 4, c + 2, 4), -1.0)
        read_rings(channel, rows, windows[:, :, :c], per_layer=per_layer)
        got[per_layer] = windows
    assert torch.equal(got[True], got[False])
    assert torch.equal(got[True][:, :, :c], channel[:, rows]) and bool((got[True][:, :, c:] == -1).all())


def test_a_step_in_the_callers_windows_equals_the_eager_slot_step() -> None:
    """`streaming_forward(..., windows=)`, how a graph runs: the rings gathered into the windows'
    first C frames with their heads, the next time caches, lengths and heads into `out`, and the
    chunk's frames written back into the rings by `write_chunk`: the same outputs and slot state,
    exactly, as the eager step over the slots. Windows of the wrong shape, windows without `out`,
    and slots in time order are refused."""
    m = model()
    rng = np.random.default_rng(11)
    c = CONTEXT[0][0]
    cache = m.encoder.init_cache(3, CONTEXT[0], m.device, m.dtype, ring=True)
    rows = torch.tensor([2, 0])
    with torch.no_grad():
        for _ in range(3):  # something in the rings, and heads off zero
            m.encoder.streaming_forward(*inputs(m, 3, rng, ragged=False)[:2], cache, CONTEXT[0], rows=torch.arange(3))
        mel, lengths, start, _ = inputs(m, 2, rng)
        mine = _copy(cache)
        x, x_len, _ = m.encoder.streaming_forward(mel, lengths, cache, CONTEXT[0], start=start, rows=rows)
        t = x.shape[1]
        assert mine.head is not None and int(mine.head[0]) != 0
        windows = torch.full((cache.channel.shape[0], 2, c + t, cache.channel.shape[-1]), float("nan"))
        windows[:, :, :c] = mine.channel[:, rows]
        given = EncoderCache(windows[:, :, :c], mine.time[:, rows], mine.channel_len[rows], mine.kv, mine.head[rows])
        out = EncoderCache(windows[:, :, :c], torch.empty_like(given.time), torch.empty_like(given.channel_len),
                           mine.kv, torch.empty_like(rows))
        y, y_len, nxt = m.encoder.streaming_forward(mel, lengths, given, CONTEXT[0], start=start, out=out,
                                                    windows=windows)
        assert nxt is out and out.head is not None and given.head is not None
        write_chunk(mine.channel, rows * c, given.head, windows[:, :, c:])
        mine.time.index_copy_(1, rows, out.time)
        mine.channel_len.index_copy_(0, rows, out.channel_len)
        mine.head.index_copy_(0, rows, out.head)
        assert torch.equal(x_len, y_len)
        torch.testing.assert_close(y, x, rtol=0, atol=0)
        for a, b in ((mine.channel, cache.channel), (mine.time, cache.time), (mine.channel_len, cache.channel_len),
                     (mine.head, cache.head)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        with pytest.raises(ValueError, match="windows"):
            m.encoder.streaming_forward(mel, lengths, given, CONTEXT[0], start=start, out=out, windows=windows[:, :1])
        with pytest.raises(ValueError, match="windows"):
            m.encoder.streaming_forward(mel, lengths, given, CONTEXT[0], start=start, windows=windows)
        in_time = m.encoder.init_cache(3, CONTEXT[0], m.device, m.dtype)
        with pytest.raises(ValueError, match="rings"):
            m.encoder.streaming_forward(mel, lengths, in_time, CONTEXT[0], start=start, rows=rows)
        with pytest.raises(ValueError, match="rings"):
            EncoderStep(m.encoder, EAGER)(in_time, rows, mel, lengths, start, att_context=CONTEXT[0])
