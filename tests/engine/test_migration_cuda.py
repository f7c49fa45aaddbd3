"""Migration and CUDA graph capture on a GPU: engine steps go on while another thread captures
graph after graph; a migration prepared while the engine thread captures graphs succeeds and breaks
no capture; a capture that fails (a synchronize inside it:
CUDA invalidates the capture) does not poison the next capture into the same memory pool; the
target's graphs are captured before the cut-over, so the steps after it capture no size it prepared
(the rest one every LAZY_SPACING_S); fp32 on
the GPU computes what the CPU does (no TF32), so a move between them changes no token."""
from __future__ import annotations

import asyncio
import copy
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

from helpers import random_model, synthetic_audio
from streamd.buckets import bucket_size
from streamd.decode import transcribe_offline
from streamd.decoding.graphs import EAGER as DEC_EAGER, GraphGreedyLabelLooping, SharedPoolBackend, make_decoder
from streamd.engine.encoder_step import GRAPHS, EncoderGraphBackend, EncoderStep, make_encoder_step
from streamd.engine.engine import Engine
from streamd.engine.placement import move_model
from streamd.engine.recognizer import Recognizer
from streamd.model.transducer import Transducer
from test_encoder_step import CONTEXT, inputs

pytestmark = pytest.mark.cuda


class FailsOnce(EncoderGraphBackend):
    """The first capture synchronises inside the graph: CUDA invalidates it."""

    def __init__(self) -> None:
        self.failed = False

    def capture(self, device: torch.device, fn: Any, pool: Any) -> Any:
        if self.failed:
            return super().capture(device, fn, pool)
        self.failed = True

        def bad() -> None:
            fn()
            torch.cuda.synchronize()
        return super().capture(device, bad, pool)


def test_a_failed_encoder_capture_does_not_poison_the_next() -> None:
    m = random_model(7, att_context_sizes=CONTEXT).cuda()
    caller = torch.cuda.current_stream()  # an earlier test's recognizer may have made it its own
    reasons: list[str] = []
    step = EncoderStep(m.encoder, GRAPHS, max_batch=64, backend=FailsOnce(), on_fallback=reasons.append)
    rng = np.random.default_rng(0)
    cache = m.encoder.init_cache(64, CONTEXT[0], m.device, m.dtype, ring=True)
    for b in (64, 16, 4, 1):  # one pool: the first capture fails, the others go into the same pool
        step(cache, torch.arange(b, device="cuda"), *inputs(m, b, rng), att_context=CONTEXT[0])
    assert len(reasons) == 1 and step.fallbacks == 1, reasons
    assert step.buckets == [1, 4, 16] and step.mode == GRAPHS and step.eager_reason == ""
    assert torch.cuda.current_stream() == caller  # the failed capture gave the caller's stream back


class DecoderFailsOnce(SharedPoolBackend):
    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def capture(self, device: torch.device, steps: dict[str, Any], warmup: Any) -> dict[str, Any]:
        if not self.failed:
            self.failed = True
            inner = steps["inner"]

            def bad() -> None:
                inner()
                torch.cuda.synchronize()
            steps = {**steps, "inner": bad}
        return super().capture(device, steps, warmup)


def test_a_failed_decoder_capture_does_not_poison_the_next() -> None:
    m = random_model(3).cuda()
    backend = DecoderFailsOnce()
    enc = torch.randn(8, 5, m.dims.d_model, device="cuda")
    lengths = torch.full((8,), 5, device="cuda")
    first = GraphGreedyLabelLooping(m.decoder, m.joint, m.dims.blank_id, max_batch=8, backend=backend)
    first(enc, lengths)
    assert first.mode == DEC_EAGER and "capture failed" in (first.fallback_reason or "")
    second = GraphGreedyLabelLooping(m.decoder, m.joint, m.dims.blank_id, max_batch=8, backend=backend)  # same pool
    second(enc, lengths)
    assert second.mode != DEC_EAGER and second.eager_reason == ""


def small_master() -> Any:
    """The fp32 CPU master weights these tests move: a 4-layer model of 128 channels."""
    return random_model(5, att_context_sizes=CONTEXT, d_model=128, n_layers=4, subsampling_channels=64)


async def graphs_again(engine: Engine, within_s: float = 30.0) -> None:
    """Wait until the engine's status says its encoder and decoder serve from graphs: after a
    move, the batch sizes the target did not prepare are captured one every LAZY_SPACING_S, and
    those in between run eagerly until then."""
    deadline = time.monotonic() + within_s
    while not (engine.status.encoder == "graphs" and engine.status.decoder != "eager"):
        assert time.monotonic() < deadline, (engine.status.encoder, engine.status.decoder, engine.status.eager_reason)
        await asyncio.sleep(0.1)


def engine_on_cuda(master: Any, slots: int, fallbacks: list[str]) -> tuple[Engine, Recognizer]:
    rec = Recognizer(copy.deepcopy(master).cuda(), slots, CONTEXT[0],
                     search_factory=lambda m: make_decoder(m, "auto", per_octave=4),
                     encoder_factory=lambda m: make_encoder_step(m, "auto", slots, fallbacks.append),
                     keep_transcripts=False)
    return Engine(rec, max_batch=slots, batch_wait_s=0.02), rec


def test_steps_go_on_while_another_thread_captures_graph_after_graph() -> None:
    """The H200 failures of 2026-12-05: while a migration's preparation captured its target's
    ~50 graphs, each on a new stream of torch's pool (32 streams, handed out round-robin), one of
    them was the stream the engine thread copied its steps' samples on: the steps failed and
    dropped thousands of streams. Here another thread captures 80 graphs the way a preparation
    does (`EncoderGraphBackend.capture`) while engine steps copy from the pinned rings; every
    step and every capture succeeds."""
    master = small_master()
    rng = np.random.default_rng(2)
    dev = torch.device("cuda")
    done = threading.Event()

    def capture_graphs() -> int:
        backend = EncoderGraphBackend()
        pool = backend.new_pool(dev)
        x = torch.ones(256, 256, device=dev)
        graphs = [backend.capture(dev, lambda: x.mul_(1.0), pool) for _ in range(80)]
        done.set()
        return len(graphs)

    async def main() -> None:
        rec = Recognizer(copy.deepcopy(master).cuda(), 16, CONTEXT[0], keep_transcripts=False, ring_copy=True,
                         search_factory=lambda m: make_decoder(m, DEC_EAGER),
                         encoder_factory=lambda m: make_encoder_step(m, "eager", 16))
        engine = Engine(rec, max_batch=16, batch_wait_s=0.01)
        engine.start()
        try:
            sessions = [await engine.open() for _ in range(16)]
            chunk = rec.geometry.samples_for(rec.geometry.frames_after(1))
            capturing = asyncio.ensure_future(asyncio.to_thread(capture_graphs))
            rounds = 0
            while not done.is_set() or rounds < 4:
                for s in sessions:
                    engine.push(s, rng.standard_normal(chunk).astype(np.float32) * 0.1)
                for s in sessions:
                    result = await asyncio.wait_for(s.results.get(), 60)
                    assert not isinstance(result, Exception), result
                chunk = rec.geometry.chunk_ms * 16
                rounds += 1
            assert await capturing == 80
            print(f"{rounds} rounds of 16 streams' steps while 80 graphs were captured")
        finally:
            done.set()
            await engine.stop()

    asyncio.run(main())


def test_a_migration_prepared_while_the_engine_captures_breaks_nothing() -> None:
    """The collision of the field report: the target is copied, probed and its graphs captured
    (with synchronize and empty_cache calls) while the engine thread captures its own graphs.
    Both succeed; the steps after the cut-over replay the target's prepared graphs."""
    master = small_master()
    fallbacks: list[str] = []
    rng = np.random.default_rng(1)

    async def main() -> None:
        engine, rec = engine_on_cuda(master, 96, fallbacks)
        engine.start()
        try:
            for _ in range(3):  # each round: a migration while the engine thread captures every bucket
                await engine.call(lambda r: (r.encoder_step.reset(), r.search.reset()))
                capturing = asyncio.ensure_future(engine.call(lambda r: r.capture_graphs(96)))
                await asyncio.sleep(0.05)
                to = torch.bfloat16 if engine.status.dtype == "fp32" else torch.float32
                report = await engine.migrate(master, None, to)
                sizes = await capturing
                assert report.ok, report
                assert sizes and fallbacks == [], fallbacks
            assert await engine.call(lambda r: r.capture_graphs(96))  # every bucket, for the last move to prepare
            enc_sizes, dec_sizes = rec.graph_sizes()
            assert enc_sizes and dec_sizes
            sessions = [await engine.open() for _ in range(40)]
            chunk = rec.geometry.samples_for(rec.geometry.frames_after(1))
            before = rec.encoder_step.captures
            for s in sessions:
                engine.push(s, rng.standard_normal(chunk).astype(np.float32) * 0.1)
            for s in sessions:
                assert await asyncio.wait_for(s.results.get(), 60) is not None
            report = await engine.migrate(master, None, torch.float32 if engine.status.dtype == "bf16" else torch.bfloat16)
            assert report.ok and report.graphs and report.recapture_ms > 0, report
            prepared, sizes = rec.encoder_step.captures, set(rec.encoder_step.buckets)
            assert bucket_size(len(sessions), rec.encoder_step.per_octave) in sizes  # the size in use
            for _ in range(3):
                for s in sessions:
                    engine.push(s, rng.standard_normal(rec.geometry.chunk_ms * 16).astype(np.float32) * 0.1)
                for s in sessions:
                    assert await asyncio.wait_for(s.results.get(), 60) is not None
            # no prepared size captured again after the cut-over (a step may split the sessions
            # into a size not used before the move: that one is captured on its first call)
            assert prepared > 0
            assert rec.encoder_step.captures - prepared == len(set(rec.encoder_step.buckets) - sizes)
            assert engine.status.encoder == "graphs" and engine.status.decoder != "eager"
            assert engine.status.attention == "kernel"  # Triton's, in the graphs of both dtypes
            assert engine.status.eager_reason == "" and fallbacks == []
            print(f"before {before}; last move: pause {report.pause_ms:.1f} ms, gap {report.serving_gap_ms} ms, "
                  f"{report.graphs} captured in {report.recapture_ms:.0f} ms")
        finally:
            await engine.stop()

    asyncio.run(main())


def test_a_migration_to_a_full_gpu_is_refused_and_serving_goes_on() -> None:
    """The field report's last move: a target that does not fit beside what serves is refused
    before anything is allocated (it once filled the GPU and the serving steps failed), and the
    streams go on from the source's graphs."""
    master = small_master()
    fallbacks: list[str] = []
    rng = np.random.default_rng(3)

    async def main() -> None:
        engine, rec = engine_on_cuda(master, 32, fallbacks)
        engine.start()
        try:
            assert await engine.call(lambda r: r.capture_graphs(32))
            sessions = [await engine.open() for _ in range(8)]
            free, total = torch.cuda.mem_get_info()
            filler = torch.empty(int(free - 0.09 * total), dtype=torch.uint8, device="cuda")  # 9 % left free
            report = await engine.migrate(master, None, torch.bfloat16)
            assert not report.ok and report.error.startswith("not enough memory on cuda"), report
            for _ in range(2):
                for s in sessions:
                    engine.push(s, rng.standard_normal(rec.geometry.chunk_ms * 16).astype(np.float32) * 0.1)
                for s in sessions:
                    assert await asyncio.wait_for(s.results.get(), 60) is not None
            assert engine.status.encoder == "graphs" and engine.status.dtype == "fp32" and fallbacks == []
            del filler
            torch.cuda.empty_cache()
            report = await engine.migrate(master, None, torch.bfloat16)
            assert report.ok and report.graphs_deferred == 0, report
        finally:
            await engine.stop()

    asyncio.run(main())


def test_moves_while_streams_step_all_along_with_graphs() -> None:
    """The H100 run of 2026-12-05 (benchmarks/h100-2026-12-05-migration): 3000 streams stepping
    from encoder graphs and the full-graph decoder the whole time, a second move's preparation
    capturing the target's encoder then decoder graphs beside them; the daemon stopped in the
    middle of the decoder captures. Here streams in changing subsets (so that many batch sizes
    are in use and prepared) step without pause through four moves bf16 <-> fp16; every move
    succeeds, every step delivers, and graphs serve after each move."""
    master = small_master()
    fallbacks: list[str] = []
    rng = np.random.default_rng(4)

    async def main() -> None:
        engine, rec = engine_on_cuda(master, 96, fallbacks)
        engine.start()
        try:
            await engine.migrate(master, None, torch.bfloat16)
            sessions = [await engine.open() for _ in range(96)]
            chunk = rec.geometry.samples_for(rec.geometry.frames_after(1))
            moving = True
            steps = 0

            async def stream_all_along() -> None:
                nonlocal steps
                first = True
                while moving or first:
                    some = sessions if first else [s for s in sessions if rng.random() < 0.6]
                    for s in some:
                        engine.push(s, rng.standard_normal(chunk if first else rec.geometry.chunk_ms * 16)
                                    .astype(np.float32) * 0.1)
                    for s in some:
                        result = await asyncio.wait_for(s.results.get(), 60)
                        assert result is not None and not isinstance(result, Exception), result
                    first = False
                    steps += 1

            streaming = asyncio.ensure_future(stream_all_along())
            await asyncio.sleep(1.0)  # many batch sizes served (and captured) before the first move
            for to in (torch.float16, torch.bfloat16, torch.float16, torch.bfloat16):
                at = steps
                report = await asyncio.wait_for(engine.migrate(master, None, to), 120)
                assert report.ok and report.graphs and report.streams_failed == 0, report
                await asyncio.sleep(0.5)
                assert steps > at and not streaming.done()
                await graphs_again(engine)
                print(f"to {to}: {report.graphs} prepared in {report.prepare_ms:.0f} ms, pause {report.pause_ms:.1f} ms,"
                      f" {steps - at} rounds of steps meanwhile")
            moving = False
            await asyncio.wait_for(streaming, 60)
            assert fallbacks == [] and engine.streams_failed == 0
        finally:
            await engine.stop()

    asyncio.run(main())


def test_fp32_on_a_gpu_is_the_cpus_fp32() -> None:
    """The H100 run of 2026-12-05 (benchmarks/h100-2026-12-05c-migration): a cuda:0 -> cpu ->
    cuda:0 move in fp32 changed the tokens of 1 stream in 16 against an unmoved run, and the GPU's
    "fp32" was not the CPU's: torch lets cuDNN's convolutions compute in TF32 by default. Placed on
    the GPU, an fp32 model computes in fp32: its encoder outputs are the CPU's within 1e-4 and its
    tokens are the CPU's, with torch's default flags on entry."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True  # torch's default
    try:
        cpu = random_model(5, att_context_sizes=CONTEXT)
        gpu = copy.deepcopy(cpu)
        move_model(gpu, torch.device("cuda", 0), torch.float32)
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        audio = torch.from_numpy(synthetic_audio(8.0, 5))

        def encode(m: Transducer) -> torch.Tensor:
            with torch.no_grad():
                a = audio.to(m.device)[None]
                mel, mel_len = m.preprocessor(a, torch.tensor([a.shape[1]], device=m.device))
                return m.encoder(mel, mel_len, m.dims.att_context(None))[0].cpu()

        torch.testing.assert_close(encode(gpu), encode(cpu), rtol=1e-4, atol=1e-4)
        tokens, _ = transcribe_offline(cpu, audio)
        assert tokens and transcribe_offline(gpu, audio)[0] == tokens
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
