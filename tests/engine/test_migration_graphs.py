"""A migration's graphs, on the CPU with fake graph backends: the target's graphs are captured
before the cut-over for the batch sizes the source had, so the first steps after it capture
nothing; a failed cut-over gives the source its own graphs back; the report says what was
captured and how long results were held; the status says why a step ran eagerly."""
from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import torch

from helpers import random_model
from streamd import cuda_capture
from streamd.buckets import bucket_size
from streamd.decoding.graphs import BucketedGraphDecoder
from streamd.engine import migration
from streamd.engine.encoder_step import EncoderStep
from streamd.engine.engine import Engine
from streamd.engine.recognizer import Recognizer
from test_encoder_step import CONTEXT, FakeBackend

SLOTS = 6


class FakeStepGraph:
    def __init__(self, fn: Any) -> None:
        self.replay = fn


class FakeDecoderBackend:
    """The decoder's graphs on the CPU: each captured step calls its function (no full graph)."""

    def __init__(self) -> None:
        self.captures: list[torch.device] = []

    def supports(self, device: torch.device) -> bool:
        return True

    def capture(self, device: torch.device, steps: dict[str, Any], warmup: Any) -> dict[str, FakeStepGraph]:
        warmup()
        self.captures.append(device)
        return {k: FakeStepGraph(f) for k, f in steps.items()}

    def instantiate(self, graphs: dict[str, Any]) -> None:
        pass

    def full_graph(self, *args: Any) -> Any:
        raise RuntimeError("no conditional nodes here")

    def release(self, device: torch.device) -> None:
        pass


class Made:
    """The encoder steps and decoders the recognizer's factories made, in order."""

    def __init__(self) -> None:
        self.encoders: list[EncoderStep] = []
        self.decoders: list[BucketedGraphDecoder] = []

    def encoder(self, m: Any) -> EncoderStep:
        self.encoders.append(EncoderStep(m.encoder, "graphs", max_batch=SLOTS, backend=FakeBackend()))
        return self.encoders[-1]

    def decoder(self, m: Any) -> BucketedGraphDecoder:
        self.decoders.append(BucketedGraphDecoder(m.decoder, m.joint, m.dims.blank_id, backend=FakeDecoderBackend()))
        return self.decoders[-1]

    def started(self, master: Any, batch_wait_s: float = 0.0) -> tuple[Recognizer, Engine]:
        """A started engine of SLOTS slots over a copy of `master`, with these factories."""
        rec = Recognizer(copy.deepcopy(master), SLOTS, CONTEXT[0], search_factory=self.decoder,
                         encoder_factory=self.encoder)
        engine = Engine(rec, max_batch=SLOTS, batch_wait_s=batch_wait_s)
        engine.start()
        return rec, engine

    def run(self, master: Any, body: Callable[[Recognizer, Engine], Awaitable[None]]) -> None:
        """`body` on a started engine (`started`), stopped after it."""
        async def main() -> None:
            rec, engine = self.started(master)
            try:
                await body(rec, engine)
            finally:
                await engine.stop()
        asyncio.run(main())

    def captures(self) -> tuple[int, int]:
        """Captures of the latest encoder step and decoder so far."""
        return len(self.encoders[-1].backend.captures), len(self.decoders[-1]._make.keywords["backend"].captures)


def warmed_and_called(r: Recognizer) -> list[int]:
    """The graph warm-up, then as if serving had just called every size it captured (the
    warm-up's own steps are no calls: `Recognizer.capture_graphs`)."""
    done = r.capture_graphs(SLOTS)
    now = time.monotonic()
    for part, sizes in zip((r.encoder_step, r.search), r.graph_sizes(), strict=True):
        part.used_at.update(dict.fromkeys(sizes, now))  # type: ignore[union-attr]
    return done


def called_ago(r: Recognizer, seconds: float, keep: tuple[list[int], list[int]] = ([], [])) -> None:
    """As if every size the encoder step and decoder were called with, but `keep`'s, had last
    been called `seconds` earlier."""
    for used, kept in zip((r.encoder_step.used_at, r.search.used_at), keep, strict=True):  # type: ignore[union-attr]
        for size in used:
            if size not in kept:
                used[size] -= seconds


def feed(engine: Engine, sessions: list[Any], audio: np.ndarray) -> None:
    for s in sessions:
        engine.push(s, audio)


async def results(sessions: list[Any], n: int) -> list[Any]:
    """The next n results of every session."""
    return [await asyncio.wait_for(s.results.get(), 30) for s in sessions for _ in range(n)]


@pytest.mark.usefixtures("exact_buckets")
def test_the_targets_graphs_are_captured_before_the_cut_over() -> None:
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    made = Made()
    rng = np.random.default_rng(0)

    async def main() -> None:
        rec, engine = made.started(master, batch_wait_s=0.05)
        try:
            warmed = await engine.call(lambda r: r.capture_graphs(SLOTS))
            assert warmed and made.encoders[0].buckets
            assert rec.graph_sizes(time.monotonic() - 60) == ([], [])  # the warm-up's steps are no calls
            sessions = [await engine.open() for _ in range(4)]
            chunk = rec.geometry.samples_for(rec.geometry.frames_after(1))
            feed(engine, sessions, rng.standard_normal(chunk).astype(np.float32) * 0.1)
            assert all(r is not None for r in await results(sessions, 1))
            assert engine.status.eager_reason == "" and engine.status.encoder == "graphs"
            sizes = rec.graph_sizes(time.monotonic() - 60)
            assert sizes == ([bucket_size(4, rec.encoder_step.per_octave)], [bucket_size(4, rec.search.per_octave)])
            captured = rec.graph_sizes()

            report = await engine.migrate(master, None, torch.bfloat16)
            assert report.ok and report.moved and report.streams == 4, report
            assert len(made.encoders) == 2 and rec.encoder_step is made.encoders[1]
            assert rec.encoder_step.capture_spacing_s == migration.LAZY_SPACING_S  # the sizes not prepared
            assert rec.search.capture_spacing_s == migration.LAZY_SPACING_S  # type: ignore[union-attr]
            assert made.encoders[0].capture_spacing_s == 0.0  # the daemon's first step: warm-up captures all
            # every batch size serving called, captured for the target, and the source's up to HEADROOM x larger
            above = migration.headroom(captured, sizes)
            assert all(b <= migration.HEADROOM * 4 for part in above for b in part) and above[1]
            assert rec.graph_sizes() == tuple(sorted(a + b) for a, b in zip(sizes, above, strict=True))
            assert report.graphs == f"encoder {len(rec.graph_sizes()[0])}, decoder {len(rec.graph_sizes()[1])}"
            assert report.recapture_ms > 0
            assert report.serving_gap_ms is None  # no stream had a chunk waiting

            before = made.captures()
            for _ in range(3):  # steps after the move replay what was prepared: no capture while streams wait
                feed(engine, sessions, rng.standard_normal(rec.geometry.chunk_ms * 16).astype(np.float32) * 0.1)
                await results(sessions, 1)
            assert made.captures() == before
            assert engine.status.dtype == "bf16" and engine.status.encoder == "graphs" and engine.status.eager_reason == ""
        finally:
            await engine.stop()

    asyncio.run(main())


def started_engine(master: Any) -> tuple[Recognizer, Engine]:
    """A two-slot engine on a copy of `master` (the CPU, eager), started."""
    rec = Recognizer(copy.deepcopy(master), 2, CONTEXT[0])
    engine = Engine(rec, max_batch=2, batch_wait_s=0.0)
    engine.start()
    return rec, engine



def test_a_warm_up_after_a_move_captures_every_size() -> None:
    """After a move the target captures sizes on calls at most one every LAZY_SPACING_S; a
    warm-up (`capture_graphs`) still captures every size it steps, and the spacing stays."""
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    made = Made()

    async def main() -> None:
        rec, engine = made.started(master)
        try:
            report = await engine.migrate(master, None, torch.bfloat16)  # nothing in use: nothing prepared
            assert report.ok and not rec.encoder_step.buckets, report
            warmed = await engine.call(lambda r: r.capture_graphs(SLOTS))
            assert len(warmed) > 1
            assert rec.encoder_step.buckets == sorted({bucket_size(n, rec.encoder_step.per_octave) for n in warmed})
            assert rec.search.captured() == sorted({bucket_size(n, rec.search.per_octave) for n in warmed})  # type: ignore[union-attr]
            assert rec.encoder_step.capture_spacing_s == migration.LAZY_SPACING_S
            assert rec.search.capture_spacing_s == migration.LAZY_SPACING_S  # type: ignore[union-attr]
        finally:
            await engine.stop()

    asyncio.run(main())


def test_the_status_counts_the_calls_that_ran_eagerly_across_a_move() -> None:
    """Status `calls` and `eager_calls` (encoder, decoder) add up every step part's calls, on
    whichever encoder step and decoder serve (a move replaces them): replayed calls count as
    calls only, a size whose capture is held runs the encoder eagerly and counts."""
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    made = Made()
    rng = np.random.default_rng(5)

    async def main() -> None:
        rec, engine = made.started(master)
        try:
            await engine.call(lambda r: r.capture_graphs(SLOTS))
            sessions = [await engine.open() for _ in range(3)]
            g, steps = rec.geometry, [0]

            async def step() -> tuple[int, tuple[int, int]]:  # one more step's audio for each stream
                steps.append(steps[-1] + 1)
                chunk = g.samples_for(g.frames_after(steps[-1])) - g.samples_for(g.frames_after(steps[-2]))
                feed(engine, sessions, rng.standard_normal(chunk).astype(np.float32) * 0.1)
                await results(sessions, 1)
                return engine.status.calls, engine.status.eager_calls

            calls, eager = await step()
            assert calls > 0
            again, eager_again = await step()  # every size captured: replayed
            assert again > calls and eager_again == eager
            assert (await engine.migrate(master, None, torch.bfloat16)).ok
            after, eager_after = await step()  # the target replays the sizes prepared for it
            assert after > again and eager_after == eager

            def hold(r: Recognizer) -> None:  # no graph for any size now, and none captured on a call
                r.encoder_step.reset()
                r.encoder_step.hold_captures = True
            await engine.call(hold)
            held, (encoder, decoder) = await step()
            assert held > after and encoder == eager[0] + held - after and decoder == eager[1]
        finally:
            await engine.stop()

    asyncio.run(main())


def test_the_serving_gap_is_measured_when_streams_go_on() -> None:
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    audio = np.random.default_rng(4).standard_normal(16000 * 40).astype(np.float32) * 0.1

    async def main() -> None:
        rec, engine = started_engine(master)
        try:
            session = await engine.open()
            engine.push(session, audio)  # a backlog of chunks: one waits at the cut-over
            assert await session.results.get() is not None
            report = await engine.migrate(master, None, torch.bfloat16)
            assert report.ok and report.serving_gap_ms is not None
            assert report.pause_ms <= report.serving_gap_ms < 3000
            assert report.graphs == "" and engine.status.eager_reason.startswith("encoder: CUDA graphs are off")
        finally:
            await engine.stop()

    asyncio.run(main())


def test_a_failed_cut_over_keeps_the_sources_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    made = Made()

    async def main() -> None:
        rec, engine = made.started(master)
        try:
            await engine.call(lambda r: r.capture_graphs(SLOTS))
            source = rec.encoder_step, rec.search
            real = Recognizer.state_tensors

            held = []

            def fails_at_bf16(self: Recognizer) -> Any:
                if self.model.dtype == torch.bfloat16:
                    held.append((rec.encoder_step.hold_captures, rec.search.hold_captures))  # type: ignore[union-attr]
                    raise torch.OutOfMemoryError("simulated: out of memory converting stream state")
                return real(self)

            monkeypatch.setattr(Recognizer, "state_tensors", fails_at_bf16)
            report = await engine.migrate(master, None, torch.bfloat16)
            assert not report.ok and "converting stream state" in report.error
            assert (rec.encoder_step, rec.search) == source and rec.encoder_step.buckets  # not made again
            # the source captured no new graph while the target was prepared, and captures again
            assert held == [(True, True)] and not rec.encoder_step.hold_captures
            assert not rec.search.hold_captures  # type: ignore[union-attr]
        finally:
            await engine.stop()

    asyncio.run(main())


def test_each_move_captures_on_another_stream_than_the_serving_graphs_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph's GEMMs use the cuBLAS workspace of the stream it was captured on: a move's
    preparation, which runs beside the serving graphs, must not capture on theirs; and the graphs
    the engine thread captures after a move must not share a stream with the source's (their
    release frees that stream's workspaces)."""
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    made = Made()
    purposes: list[str] = []
    real_prepare = BucketedGraphDecoder.prepare

    def recording(self: BucketedGraphDecoder, *args: Any) -> list[int]:
        purposes.append(cuda_capture.capture_purpose())
        return real_prepare(self, *args)

    monkeypatch.setattr(BucketedGraphDecoder, "prepare", recording)

    async def main() -> None:
        rec, engine = made.started(master)

        async def move(dtype: torch.dtype, ok: bool = True) -> str:
            """The capture stream the move's preparation used."""
            await engine.call(warmed_and_called)  # sizes in use: the move prepares them
            purposes.clear()
            report = await engine.migrate(master, None, dtype)
            assert report.ok == ok and purposes and len(set(purposes)) == 1, (report, purposes)
            return purposes[0]

        def lazy() -> Any:  # where the engine thread captures the sizes not prepared
            return engine.call(lambda r: cuda_capture.capture_purpose())

        try:
            assert await lazy() == cuda_capture.CAPTURE
            assert rec.prepared_on == "" and await move(torch.bfloat16) == "migration-a"
            assert await lazy() == "capture-migration-a"
            assert rec.prepared_on == "migration-a" and await move(torch.float32) == "migration-b"
            assert await lazy() == "capture-migration-b"

            def fails(*args: Any) -> Any:
                raise migration.MigrationFailed("simulated: the cut-over failed")

            with monkeypatch.context() as m:  # prepared, then not swapped in
                m.setattr(Engine, "cut_over", fails)
                assert await move(torch.bfloat16, ok=False) == "migration-a"
            assert rec.prepared_on == "migration-b"  # the graphs serving now: the next move avoids them
            assert await lazy() == "capture-migration-b"
            assert await move(torch.bfloat16) == "migration-a" and rec.prepared_on == "migration-a"
            assert cuda_capture.capture_purpose() == cuda_capture.CAPTURE  # only inside the preparation
        finally:
            await engine.stop()

    asyncio.run(main())


@pytest.mark.parametrize("kv", [True, False])
def test_target_bytes_are_what_the_target_allocates(kv: bool) -> None:
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    target = copy.deepcopy(master).to(torch.bfloat16)
    cache = target.encoder.init_cache(SLOTS, CONTEXT[0], "cpu", torch.bfloat16, kv, ring=True)
    held = sum(t.numel() * t.element_size() for t in (*target.parameters(), *target.buffers()))
    held += sum(t.numel() * t.element_size() for t in (cache.channel, cache.time, cache.channel_len, cache.head))
    assert migration.target_bytes(master, torch.bfloat16, SLOTS, CONTEXT[0], kv) == held


def test_a_target_without_room_is_refused_before_anything_is_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU too full for the target's weights and stream state: the move is refused with the
    numbers, no target is made, and serving goes on from the source's graphs."""
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    made = Made()
    need = migration.target_bytes(master, torch.bfloat16, SLOTS, CONTEXT[0])
    total = 100 * need
    monkeypatch.setattr(migration, "free_memory", lambda device: (10 * need, total))  # exactly the 10 % kept
    rng = np.random.default_rng(1)

    async def main() -> None:
        rec, engine = made.started(master)
        try:
            await engine.call(lambda r: r.capture_graphs(SLOTS))
            report = await engine.migrate(master, None, torch.bfloat16)
            assert not report.ok and report.error.startswith("not enough memory on cpu for the model and its stream state")
            assert "10% kept for serving" in report.error and len(made.encoders) == 1  # no target made
            sessions = [await engine.open() for _ in range(2)]
            before = made.captures()
            feed(engine, sessions, rng.standard_normal(rec.geometry.chunk_ms * 16).astype(np.float32) * 0.1)
            assert all(r is not None for r in await results(sessions, 1))
            assert made.captures() == before and engine.status.encoder == "graphs" and engine.status.dtype == "fp32"
        finally:
            await engine.stop()

    asyncio.run(main())



def room_for_two_graphs() -> Callable[[torch.device], tuple[int, int]]:
    """A `migration.free_memory` whose first call (the weights and state check) and the next two
    (room for two graphs) find plenty free, and every later one less than the share kept for serving."""
    checks: list[int] = []

    def free_memory(device: torch.device) -> tuple[int, int]:
        checks.append(1)
        return (10**12 if len(checks) <= 3 else 10**9, 10**12)

    return free_memory

@pytest.mark.usefixtures("exact_buckets")
def test_graphs_stop_at_the_memory_kept_for_serving_and_the_rest_follow_the_move(monkeypatch: pytest.MonkeyPatch) -> None:
    """Free memory falls to the share kept for serving after two captures: the move goes on,
    the report counts the batch sizes left, and each is captured on its first step after it."""
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    made = Made()
    monkeypatch.setattr(migration, "free_memory", room_for_two_graphs())
    rng = np.random.default_rng(2)

    async def main() -> None:
        rec, engine = made.started(master)
        try:
            await engine.call(warmed_and_called)
            enc_sizes, dec_sizes = rec.graph_sizes()
            assert len(enc_sizes) + len(dec_sizes) > 2
            report = await engine.migrate(master, None, torch.bfloat16)
            assert report.ok and report.graphs_deferred == len(enc_sizes) + len(dec_sizes) - 2, report
            assert rec.graph_sizes() == ([max(enc_sizes)], [max(dec_sizes)])  # a step needs both: the largest of each
            sessions = [await engine.open() for _ in range(SLOTS)]
            for n in (SLOTS, 1):  # a full step and a single stream's: sizes left by the guard, captured now
                feed(engine, sessions[:n], rng.standard_normal(rec.geometry.chunk_ms * 16).astype(np.float32) * 0.1)
                assert all(r is not None for r in await results(sessions[:n], 1))
            assert engine.status.encoder == "graphs" and engine.status.eager_reason == ""
            assert bucket_size(1, rec.encoder_step.per_octave) in rec.graph_sizes()[0]
        finally:
            await engine.stop()

    asyncio.run(main())


def test_a_group_is_prepared_as_a_cover_of_its_sizes() -> None:
    """Sizes within NEAR_PADDING of a larger one a group before took, or that this group takes,
    are not captured; sizes up to PAD_ROWS share one graph."""
    hot, in_use = ([600, 500, 100], [640]), ([1, 3, 500, 700, 96, 60], [512, 480, 8])
    assert migration._in_turn([hot, in_use]) == [
        ("encoder", 600), ("decoder", 640), ("encoder", 100),
        ("encoder", 700), ("decoder", 480), ("encoder", 60), ("decoder", 8), ("encoder", 3)]


@pytest.mark.usefixtures("exact_buckets")
def test_a_group_is_prepared_encoder_and_decoder_in_turn_largest_first() -> None:
    """Each group in turn; in it, the encoder's and the decoder's sizes alternate, largest
    first, the longer list's rest after; a size a group before had is not taken again."""
    hot, in_use = ([3, 8], [6]), ([1, 3, 8, 16], [2, 6])
    assert migration._in_turn([hot, in_use]) == [
        ("encoder", 8), ("decoder", 6), ("encoder", 3),
        ("encoder", 16), ("decoder", 2), ("encoder", 1)]
    assert migration._in_turn([([], [4]), ([], [])]) == [("decoder", 4)]


@pytest.mark.usefixtures("exact_buckets")
def test_the_allocators_cache_is_given_back_once_before_graphs_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Free memory looks short after two captures until the allocator's cached blocks are given
    back: the guard empties the cache once and every size is prepared. If it still looks short
    after that, the guard does not empty it again: the rest are deferred."""
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    emptied: list[torch.device] = []
    monkeypatch.setattr(migration, "_empty_cache", emptied.append)

    def short_until_emptied() -> Callable[[torch.device], tuple[int, int]]:
        short, before = room_for_two_graphs(), len(emptied)
        return lambda device: (10**12, 10**12) if len(emptied) > before else short(device)

    async def moved(free_memory: Callable[[torch.device], tuple[int, int]]) -> tuple[migration.MigrationReport, int, int]:
        """A move to bf16 with `free_memory` after a warm-up: its report, how often it emptied
        the cache, and how many graph sizes the warm-up made."""
        rec, engine = Made().started(master)
        try:
            await engine.call(warmed_and_called)
            sizes = sum(map(len, rec.graph_sizes()))
            monkeypatch.setattr(migration, "free_memory", free_memory)
            before = len(emptied)
            report = await engine.migrate(master, None, torch.bfloat16)
            return report, len(emptied) - before, sizes
        finally:
            await engine.stop()

    report, plain, sizes = asyncio.run(moved(lambda device: (10**12, 10**12)))  # the source's release
    assert report.ok and report.graphs_deferred == 0 and sizes > 2, report
    report, n, _ = asyncio.run(moved(short_until_emptied()))
    assert report.ok and report.graphs_deferred == 0 and n == plain + 1, (report, n)
    report, n, _ = asyncio.run(moved(room_for_two_graphs()))
    assert report.ok and report.graphs_deferred == sizes - 2 and n == plain + 1, (report, n)  # once a move


def test_only_the_batch_sizes_in_use_are_prepared() -> None:
    """The warm-up captured every size; only those called in the last IN_USE_S seconds are
    captured for the target before the cut-over (the others wait for their first call)."""
    made, rng = Made(), np.random.default_rng(5)

    async def body(rec: Recognizer, engine: Engine) -> None:
        await engine.call(warmed_and_called)
        enc_sizes, dec_sizes = rec.graph_sizes()
        assert len(enc_sizes) > 1 and len(dec_sizes) > 1
        called_ago(rec, migration.IN_USE_S + 1.0)  # as if the warm-up had been a minute ago
        session = await engine.open()
        feed(engine, [session], rng.standard_normal(rec.geometry.chunk_ms * 16).astype(np.float32) * 0.1)
        await results([session], 1)
        one = bucket_size(1, rec.encoder_step.per_octave)
        report = await engine.migrate(master, None, torch.bfloat16)
        assert report.ok and report.graphs == "encoder 1, decoder 1" and report.graphs_deferred == 0, report
        assert rec.graph_sizes() == ([one], [bucket_size(1, rec.search.per_octave)])

    master = random_model(seed=2, att_context_sizes=CONTEXT)
    made.run(master, body)


def test_a_move_prepares_a_cover_of_the_sizes_called_and_the_target_replays_it_padded() -> None:
    """Every size serving called gets a graph of at most NEAR_PADDING x its rows or PAD_ROWS
    (here one of each part: SLOTS rows are few); after the move the encoder replays it for
    every batch size, padded (the status counts those calls), and captures none of its own on
    the engine thread."""
    made, rng = Made(), np.random.default_rng(5)

    async def body(rec: Recognizer, engine: Engine) -> None:
        await engine.call(warmed_and_called)
        enc_sizes, dec_sizes = rec.graph_sizes()
        report = await engine.migrate(master, None, torch.bfloat16)
        assert len(enc_sizes) > 1 and len(dec_sizes) > 1 and report.ok, report
        assert report.graphs == "encoder 1, decoder 1" and rec.graph_sizes() == ([max(enc_sizes)], [max(dec_sizes)])
        sessions = [await engine.open() for _ in range(SLOTS)]
        before, padded, calls = made.captures()[0], engine.status.padded_calls[0], engine.status.calls
        for n in range(SLOTS, 0, -1):
            feed(engine, sessions[:n], rng.standard_normal(rec.geometry.chunk_ms * 16).astype(np.float32) * 0.1)
            assert all(r is not None for r in await results(sessions[:n], 1))
            assert engine.status.encoder == "graphs"
        assert rec.encoder_step.buckets == [max(enc_sizes)] and made.captures()[0] == before
        assert 0 < engine.status.padded_calls[0] - padded < engine.status.calls - calls  # the smaller steps

    master = random_model(seed=2, att_context_sizes=CONTEXT)
    made.run(master, body)


@pytest.mark.usefixtures("exact_buckets")
def test_a_move_back_prepares_the_sizes_that_placement_was_called_with() -> None:
    """fp32 -> bf16 -> fp32: the move back captures, beside the sizes bf16 is called with, those
    fp32 was called with before it left (a faster placement steps smaller batches: on an H100 a
    third to 60 % of the encoder's calls after a move back to bf16 ran eagerly)."""
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    made = Made()
    rng = np.random.default_rng(5)

    async def main() -> None:
        rec, engine = made.started(master)
        try:
            await engine.call(warmed_and_called)
            enc_sizes, dec_sizes = rec.graph_sizes()
            fp32 = (enc_sizes[-2:], dec_sizes[-2:])  # fp32 was called with its two largest of each
            await engine.call(lambda r: called_ago(r, migration.CALLED_BEFORE_S + 1.0, fp32))
            assert (await engine.migrate(master, None, torch.bfloat16)).ok
            assert rec.graph_sizes() == fp32
            session = await engine.open()  # bf16 is called with one stream only
            feed(engine, [session], rng.standard_normal(rec.geometry.chunk_ms * 16).astype(np.float32) * 0.1)
            await results([session], 1)
            bf16 = rec.graph_sizes(time.monotonic() - 1.0)
            assert bf16 == ([bucket_size(1, rec.encoder_step.per_octave)], [bucket_size(1, rec.search.per_octave)])
            await engine.call(lambda r: called_ago(r, migration.CALLED_BEFORE_S + 1.0, bf16))
            report = await engine.migrate(master, None, torch.float32)
            assert report.ok, report
            assert rec.graph_sizes() == tuple(sorted(set(a) | set(b)) for a, b in zip(bf16, fp32, strict=True))
        finally:
            await engine.stop()

    asyncio.run(main())


@pytest.mark.usefixtures("exact_buckets")
def test_the_sizes_called_last_are_prepared_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for two graphs, the encoder's and the decoder's size of the last steps get them
    (not the two largest of the encoder's, as when every size was called as recently): the
    first steps after the move replay instead of capturing (an H200 move at 4500 streams with
    decoder graphs left over opened a 250-350 ms gap)."""
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    made = Made()
    rng = np.random.default_rng(3)

    async def main() -> None:
        rec, engine = made.started(master)
        try:
            await engine.call(warmed_and_called)
            enc_sizes, dec_sizes = rec.graph_sizes()
            assert len(enc_sizes) > 1 and len(dec_sizes) > 1
            for used in (rec.encoder_step.used_at, rec.search.used_at):
                for size in used:
                    used[size] -= migration.HOT_S + 1.0  # called within IN_USE_S, not within HOT_S
            session = await engine.open()
            feed(engine, [session], rng.standard_normal(rec.geometry.chunk_ms * 16).astype(np.float32) * 0.1)
            await results([session], 1)
            monkeypatch.setattr(migration, "free_memory", room_for_two_graphs())
            report = await engine.migrate(master, None, torch.bfloat16)
            assert report.ok and report.graphs_deferred == len(enc_sizes) + len(dec_sizes) - 2, report
            assert rec.graph_sizes() == ([bucket_size(1, rec.encoder_step.per_octave)],
                                         [bucket_size(1, rec.search.per_octave)])
        finally:
            await engine.stop()

    asyncio.run(main())


def test_the_headroom_is_the_captured_sizes_above_the_largest_called() -> None:
    captured = ([8, 9, 10, 12, 14, 16, 18], [4, 8, 16])
    assert migration.headroom(captured, ([8, 10], [4])) == ([12, 14], [])  # 10 < b <= 15
    assert migration.headroom(captured, ([], [16])) == ([], [])  # nothing called: nothing above it


def test_the_pacer_gives_serving_the_time_between_captures() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    for share, expect in ((0.5, [2.0, 1.0]), (0.25, [6.0, 3.0]), (1.0, [])):
        slept.clear()
        pace = migration.Pacer(share, clock=lambda: now[0], sleep=sleep)
        pace()  # the first capture starts at once
        for capture_s in (2.0, 1.0):
            now[0] += capture_s
            pace()
        assert slept == expect and pace.waited == sum(expect)


def test_the_pacer_waits_while_the_engine_is_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `behind`, no capture starts while it is over BEHIND_LIMIT_S: at most BEHIND_WAIT_S
    a capture, BEHIND_BUDGET_S in all."""
    monkeypatch.setattr(migration, "BEHIND_BUDGET_S", 5.0)
    now = [0.0]
    lag = [0.0]

    def sleep(s: float) -> None:
        now[0] += s
        lag[0] = max(0.0, lag[0] - s)  # the engine catches up as time passes

    pace = migration.Pacer(1.0, clock=lambda: now[0], sleep=sleep, behind=lambda: lag[0])
    pace()
    assert now[0] == 0.0  # not behind: at once
    lag[0] = 1.0
    pace()
    assert now[0] == pytest.approx(1.0 - migration.BEHIND_LIMIT_S, abs=migration.BEHIND_POLL_S)
    start = now[0]
    lag[0] = 100.0  # far behind: waits BEHIND_WAIT_S, then captures anyway
    pace()
    assert now[0] - start == pytest.approx(migration.BEHIND_WAIT_S, abs=migration.BEHIND_POLL_S)
    for _ in range(3):
        lag[0] = 100.0
        pace()
    assert pace.waited_behind == pytest.approx(5.0, abs=migration.BEHIND_POLL_S)  # the budget
    assert pace.waited == pace.waited_behind


@pytest.mark.usefixtures("exact_buckets")
def test_a_migration_paces_every_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    made = Made()
    paced: list[migration.Pacer] = []

    class Counting(migration.Pacer):
        def __call__(self) -> None:
            paced.append(self)
            super().__call__()

    monkeypatch.setattr(migration, "Pacer", Counting)

    async def main() -> None:
        rec, engine = made.started(master)
        try:
            await engine.call(warmed_and_called)
            enc_sizes, dec_sizes = rec.graph_sizes()
            report = await engine.migrate(master, None, torch.bfloat16)
            assert report.ok and rec.graph_sizes() == (enc_sizes, dec_sizes), report
            # one pacer, called before each encoder and decoder size (the hot ones, then all in use)
            assert len(paced) >= len(enc_sizes) + len(dec_sizes) and len(set(map(id, paced))) == 1
        finally:
            await engine.stop()

    asyncio.run(main())


def test_the_serving_gap_is_measured_when_no_chunk_waits_at_the_cut_over() -> None:
    """The H100 run of 2026-12-05 (4500 streams at 1120 ms) reported no gap for a move: at the
    cut-over no stream was known to have a chunk ready (their audio was still in the inbox). An
    open stream's next step is awaited all the same, and the gap counts from when its chunk came
    (not the half second without audio before it)."""
    master = random_model(seed=2, att_context_sizes=CONTEXT)
    rng = np.random.default_rng(5)

    async def main() -> None:
        rec, engine = started_engine(master)
        try:
            session = await engine.open()
            chunk = rec.geometry.samples_for(rec.geometry.frames_after(1))
            engine.push(session, rng.standard_normal(chunk).astype(np.float32) * 0.1)
            assert await session.results.get() is not None  # nothing waits now
            moving = asyncio.ensure_future(engine.migrate(master, None, torch.bfloat16))
            while not engine.status.dtype == "bf16":
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)
            engine.push(session, rng.standard_normal(rec.geometry.chunk_ms * 16).astype(np.float32) * 0.1)
            report = await asyncio.wait_for(moving, 30)
            assert report.ok and report.serving_gap_ms is not None and 0 < report.serving_gap_ms < 400, report
            assert await session.results.get() is not None
        finally:
            await engine.stop()

    asyncio.run(main())
