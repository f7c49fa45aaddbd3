"""The encoder step in CUDA graphs on a GPU: parity with the eager step (encoder outputs and
caches within tolerance, identical tokens), batches padded to their bucket, moves of the model
between steps (dtype, device, CPU and back), memory given back on re-capture, and a capture that
fails leaving the step (and CUDA) working."""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from helpers import random_model, run_streams, synthetic_audio
from streamd.audio.features import logmel_many
from streamd.decoding.graphs import make_decoder
from streamd.decoding.greedy import GreedyLabelLooping
from streamd.engine.encoder_step import EAGER, GRAPHS, EncoderGraphBackend, EncoderStep
from streamd.engine.recognizer import Recognizer
from streamd.model.transducer import Transducer
from test_encoder_step import CONTEXT, assert_same, inputs, simulate

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def _exact_fp32() -> Iterator[None]:
    """No TF32: graphs run batches padded to their bucket, and TF32 rounds differently in
    differently shaped kernels."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def model(seed: int = 3, **kw: Any) -> Transducer:
    return random_model(seed, att_context_sizes=CONTEXT, **kw).cuda()


def close(a: tuple[list, list], b: tuple[list, list], k: int, tol: float) -> None:
    """Step function 0 of `a` against `k` of `b`: lengths equal, outputs and caches within tol."""
    (outs_a, caches_a), (outs_b, caches_b) = a, b
    for (ea, la), (eb, lb) in zip(outs_a[0], outs_b[k]):
        assert torch.equal(la, lb)
        torch.testing.assert_close(ea, eb, rtol=tol, atol=tol)
    for x, y in ((caches_a[0].channel, caches_b[k].channel), (caches_a[0].time, caches_b[k].time)):
        torch.testing.assert_close(x, y, rtol=tol, atol=tol)
    assert torch.equal(caches_a[0].channel_len, caches_b[k].channel_len)


# -- parity ------------------------------------------------------------------------------------
@pytest.mark.parametrize("slots", [1, 7, 64, 300])
def test_graphs_equal_eager(slots: int) -> None:
    """Random subsets of the slots in random order, ragged windows, 20 chunks."""
    m = model(slots)
    eager, graphs = EncoderStep(m.encoder, EAGER), EncoderStep(m.encoder, GRAPHS)
    got = simulate([eager, graphs], m, slots=slots, chunks=20, seed=slots)
    close(got, got, 1, 1e-4)
    assert graphs.mode == GRAPHS and graphs.fallbacks == 0 and graphs.rebuilds == 1
    assert graphs.buckets and graphs.key is not None and graphs.key.device == torch.device("cuda", 0)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 0.1)])
def test_both_cache_layouts_give_the_same_outputs(dtype: torch.dtype, tol: float) -> None:
    """NeMo's input cache (eager, the reference) against the key/value cache, from graphs and
    eagerly: the same encoder outputs."""
    m = model(8).to(dtype)
    steps = [EncoderStep(m.encoder, EAGER), EncoderStep(m.encoder, GRAPHS), EncoderStep(m.encoder, EAGER)]
    outs, caches = simulate(steps, m, slots=64, chunks=20, seed=8, kv=[False, True, True])
    for k in (1, 2):
        for (ea, la), (eb, lb) in zip(outs[0], outs[k]):
            assert torch.equal(la, lb)
            torch.testing.assert_close(eb, ea, rtol=tol, atol=tol)
    assert steps[1].mode == GRAPHS and steps[1].key is not None and steps[1].key.kv
    assert caches[1].channel.shape[-1] == 2 * m.dims.d_model and not caches[0].kv


def test_tokens_identical_in_both_cache_layouts() -> None:
    """The daemon's configuration (graphs in encoder and decoder) on the key/value cache against
    the eager encoder on NeMo's input cache: identical tokens, streams joining and leaving."""
    def run(kv: bool, encoder: Callable[[Transducer], EncoderStep], decoder: Callable[[Transducer], Any]) -> list:
        m = random_model(4, att_context_sizes=CONTEXT).cuda()
        rec = Recognizer(m, capacity=len(AUDIOS), search_factory=decoder, encoder_factory=encoder, kv_cache=kv)
        return run_streams(m, None, AUDIOS, STARTS, seed=1, recognizer=rec)[0]

    want = run(False, eager_step, greedy)
    got = run(True, graph_step, lambda m: make_decoder(m, "auto", per_octave=4))
    assert got == want and sum(len(t) for t, _ in want) > 0


def test_a_larger_encoder_at_large_padded_batches() -> None:
    m = model(1, d_model=256, n_layers=4, subsampling_channels=64)
    eager, graphs = EncoderStep(m.encoder, EAGER), EncoderStep(m.encoder, GRAPHS)
    sizes = (700, 1000, 513, 1000, 77, 999)
    got = simulate([eager, graphs], m, slots=1000, chunks=len(sizes), seed=0, sizes=sizes)
    close(got, got, 1, 1e-4)
    assert graphs.buckets == [80, 576, 704, 1024] and graphs.static_rows == 1024
    print(f"buckets {graphs.buckets}, static rows {graphs.static_rows}, last capture {graphs.last_capture_ms:.0f} ms")


def test_bf16_graphs_agree_with_bf16_eager() -> None:
    m = model(5).to(torch.bfloat16)
    eager, graphs = EncoderStep(m.encoder, EAGER), EncoderStep(m.encoder, GRAPHS)
    got = simulate([eager, graphs], m, slots=48, chunks=16, seed=5)
    close(got, got, 1, 0.1)
    assert graphs.key is not None and graphs.key.dtype == torch.bfloat16 and graphs.mode == GRAPHS


AUDIOS = [synthetic_audio(s, 20 + i) for i, s in enumerate([2.8, 1.1, 3.5, 2.0, 0.7, 2.2, 1.6])]
STARTS = [0, 2, 5, 8, 22, 3, 3]


def streams(device: str, encoder: Callable[[Transducer], EncoderStep], decoder: Callable[[Transducer], Any],
            events: Callable[[Transducer], dict[int, Callable[[], Any]]] = lambda m: {}
            ) -> tuple[list, EncoderStep]:
    m = random_model(4, att_context_sizes=CONTEXT).to(device)  # fresh: moves can round weights
    step = encoder(m)
    got, _ = run_streams(m, decoder(m), AUDIOS, STARTS, seed=1, events=events(m), encoder=step)
    return got, step


def eager_step(m: Transducer) -> EncoderStep:
    return EncoderStep(m.encoder, EAGER)


def graph_step(m: Transducer) -> EncoderStep:
    return EncoderStep(m.encoder, GRAPHS)


def greedy(m: Transducer) -> GreedyLabelLooping:
    return GreedyLabelLooping(m.decoder, m.joint, m.dims.blank_id)


def test_tokens_identical_with_graphs_in_encoder_and_decoder() -> None:
    """The daemon's configuration: both steps from graphs, streams joining and leaving."""
    want, _ = streams("cuda", eager_step, greedy)
    got, step = streams("cuda", graph_step, lambda m: make_decoder(m, "auto", per_octave=4))
    assert got == want and sum(len(t) for t, _ in want) > 0
    assert step.mode == GRAPHS and step.fallbacks == 0


def test_features_on_the_gpu_equal_features_on_the_cpu() -> None:
    """The daemon computes a step's log-mel frames on the model's device; the CPU path is the
    reference: frames within 1e-4 (log domain), identical tokens."""
    m = random_model(4, att_context_sizes=CONTEXT)
    rng = np.random.default_rng(0)
    segments = [rng.normal(0, 0.1, int(n)).astype(np.float32) for n in rng.integers(512, 20000, 40)]
    cpu = logmel_many(m.preprocessor, segments)
    gpu = logmel_many(copy.deepcopy(m.preprocessor).cuda(), segments)
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    m = m.cuda()
    want, _ = run_streams(m, greedy(m), AUDIOS, STARTS, seed=1, features="cpu")
    got, _ = run_streams(m, greedy(m), AUDIOS, STARTS, seed=1, features="model")
    assert got == want and sum(len(t) for t, _ in want) > 0


# -- moves between steps -----------------------------------------------------------------------
def test_fp32_bf16_fp32() -> None:
    def moves(m: Transducer) -> dict[int, Callable[[], Any]]:
        return {8: lambda: m.to(torch.bfloat16), 16: lambda: m.to(torch.float32)}

    want, _ = streams("cuda", eager_step, greedy, moves)
    got, step = streams("cuda", graph_step, greedy, moves)
    assert step.rebuilds == 3 and step.key is not None and step.key.dtype == torch.float32
    assert "dtype torch.bfloat16 -> torch.float32" in step.last_rebuild_reason
    fp32_only = [i for i, s in enumerate(STARTS) if s >= 16]  # the rest went through bf16
    assert all(got[i] == want[i] for i in fp32_only)
    print(f"fp32->bf16->fp32: {sum(g == w for g, w in zip(got, want))}/{len(want)} streams identical")


def test_cpu_cuda_cpu() -> None:
    def moves(m: Transducer) -> dict[int, Callable[[], Any]]:
        return {6: lambda: m.to("cuda"), 18: lambda: m.to("cpu")}

    want, _ = streams("cpu", eager_step, greedy)  # all on the CPU
    got, step = streams("cpu", graph_step, greedy, moves)
    assert got == want and step.rebuilds == 1 and step.mode == EAGER and step.captures > 0


def test_the_eager_step_keeps_its_windows_only_on_a_cpu() -> None:
    """The eager step's attention windows stay allocated between steps on a CPU; a model moved
    to the GPU lets them go (CUDA's caching allocator keeps its own blocks)."""
    m = random_model(3, att_context_sizes=CONTEXT)
    step, rng, held = EncoderStep(m.encoder, EAGER), np.random.default_rng(5), []
    for device in ("cpu", "cuda", "cpu"):
        m.to(device)
        cache = m.encoder.init_cache(4, CONTEXT[0], m.device, m.dtype, ring=True)
        mel, lengths, start, full = inputs(m, 4, rng)
        step(cache, torch.arange(4, device=m.device), mel, lengths, start, full, att_context=CONTEXT[0])
        held.append(step._work._buf is not None)
    assert held == [True, False, True]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda0_cuda1_cuda0() -> None:
    def moves(m: Transducer) -> dict[int, Callable[[], Any]]:
        return {6: lambda: m.to("cuda:1"), 18: lambda: m.to("cuda:0")}

    want, _ = streams("cuda", eager_step, greedy)
    got, step = streams("cuda", graph_step, greedy, moves)
    assert got == want and step.rebuilds == 3 and step.key is not None
    assert step.key.device == torch.device("cuda", 0)


def test_recaptures_give_memory_back() -> None:
    m = model(6, d_model=256, n_layers=4, subsampling_channels=64)
    step = EncoderStep(m.encoder, GRAPHS)
    rng = np.random.default_rng(0)
    reserved = []
    for i in range(6):
        m.to(torch.bfloat16 if i % 2 else torch.float32)
        cache = m.encoder.init_cache(256, CONTEXT[0], m.device, m.dtype, ring=True)
        step(cache, torch.arange(256, device="cuda"), *inputs(m, 256, rng), att_context=CONTEXT[0])
        del cache
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved() / 2**20)
    print("reserved MiB after each re-capture:", [round(r) for r in reserved])
    assert step.rebuilds == 6 and max(reserved[2:]) <= 1.1 * max(reserved[:2]) + 64


# -- a capture that fails ----------------------------------------------------------------------
class SyncsInCapture(EncoderGraphBackend):
    """Capture of a function that synchronises: CUDA refuses it mid-capture."""

    def capture(self, device: torch.device, fn: Any, pool: Any) -> Any:
        def bad() -> None:
            fn()
            torch.cuda.synchronize()
        return super().capture(device, bad, pool)


def test_a_failed_capture_falls_back_to_eager_and_cuda_keeps_working() -> None:
    m = model(7)
    caller = torch.cuda.current_stream()  # an earlier test's recognizer may have made it its own
    reasons: list[str] = []
    eager = EncoderStep(m.encoder, EAGER)
    bad = EncoderStep(m.encoder, GRAPHS, backend=SyncsInCapture(), on_fallback=reasons.append)
    got = simulate([eager, bad], m, slots=9, chunks=6, seed=7)
    assert_same(got, got)
    assert bad.mode == EAGER and bad.fallbacks >= 1 and reasons and bad.buckets == []
    assert torch.cuda.current_stream() == caller  # the failed captures gave the caller's stream back
    good = EncoderStep(m.encoder, GRAPHS)  # the device is still fine for capture
    again = simulate([eager, good], m, slots=9, chunks=6, seed=8)
    close(again, again, 1, 1e-4)
    assert good.mode == GRAPHS


@pytest.mark.usefixtures("exact_buckets")
def test_a_size_replaying_a_larger_captured_graph_equals_eager() -> None:
    """Captures held: 7 rows replay the graph of 12 (padded), 5 rows run eagerly; outputs and
    caches as the eager step's."""
    m = model(4)
    eager, graphs = EncoderStep(m.encoder, EAGER), EncoderStep(m.encoder, GRAPHS)
    modes: list[str] = []

    def held(chunk: int) -> None:
        if chunk:
            modes.append(graphs.mode)
        graphs.hold_captures = chunk > 0

    got = simulate([eager, graphs], m, slots=12, chunks=4, seed=4, sizes=(12, 7, 5, 7), between=held)
    close(got, got, 1, 1e-4)
    modes.append(graphs.mode)
    assert modes == [GRAPHS, GRAPHS, EAGER, GRAPHS] and graphs.buckets == [12]
