"""The engine thread on its own: batching, and streams that close while a batch fills."""
from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from pathlib import Path
from collections.abc import Callable

import numpy as np
import pytest
import torch

from helpers import random_model
from streamd.engine import migration
from streamd.engine.recognizer import Recognizer
from streamd.engine.engine import Engine
from streamd.engine.step_times import HostCpu, StepTimes
from streamd.engine.stream import Stream


def test_streams_closing_during_the_batch_wait_start_no_empty_step(caplog: pytest.LogCaptureFixture) -> None:
    """A ready stream that closes while the engine waits for a second one to fill the batch leaves
    nothing to step: no step runs, and nothing is logged as a failed step."""
    rec = Recognizer(random_model(), capacity=4)
    batches: list[int] = []
    real_launch = rec.launch

    def launch(streams: list[Stream]) -> object:
        batches.append(len(streams))
        return real_launch(streams)

    rec.launch = launch  # type: ignore[method-assign, assignment]

    async def main() -> None:
        engine = Engine(rec, max_batch=4, batch_wait_s=0.5)
        engine.start()
        try:
            ready, idle = await engine.open(), await engine.open()
            engine.push(ready, np.zeros(16000 * 3, dtype=np.float32))  # a full chunk: the batch waits for `idle`
            await asyncio.sleep(0.1)
            engine.close(ready)
            await asyncio.sleep(0.8)  # past the batch wait
            engine.push(idle, np.zeros(16000 * 3, dtype=np.float32))
            engine.end(idle)
            while await idle.results.get() is not None:
                pass
        finally:
            await engine.stop()

    with caplog.at_level(logging.ERROR, logger="streamd.engine"):
        asyncio.run(main())
    assert batches and 0 not in batches
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_lag_is_how_long_the_last_steps_oldest_chunk_waited_and_nothing_once_caught_up() -> None:
    """`Engine.lag_s` (what a migration's captures wait on): a chunk that waited out a 0.3-s batch
    wait for a second stream makes the step's lag at least that; with nothing waiting it is 0."""
    rec = Recognizer(random_model(), capacity=4)
    lags: list[float] = []

    async def main() -> None:
        engine = Engine(rec, max_batch=4, batch_wait_s=0.3, on_step=lambda *_: lags.append(engine.lag_s))
        engine.start()
        try:
            ready, _idle = await engine.open(), await engine.open()  # the batch waits for the idle one
            engine.push(ready, np.zeros(rec.geometry.samples_for(rec.geometry.frames_after(1)), dtype=np.float32))
            assert await asyncio.wait_for(ready.results.get(), 30) is not None
            deadline = time.monotonic() + 5
            while engine.lag_s and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert engine.lag_s == 0.0
        finally:
            await engine.stop()

    asyncio.run(main())
    assert len(lags) == 1 and lags[0] >= 0.3


def test_capture_graphs_steps_every_bucket_and_frees_its_slots() -> None:
    """The daemon's warm-up on a GPU: one step per batch bucket up to the capacity, largest
    first (here eagerly, on the CPU); afterwards every slot is free again."""
    from streamd.buckets import bucket_size

    rec = Recognizer(random_model(), capacity=40)
    sizes = rec.capture_graphs(40)
    assert sizes == sorted(set(sizes), reverse=True) and sizes[0] == 40 and sizes[-1] == 1
    assert {bucket_size(n) for n in range(1, 41)} <= {bucket_size(n) for n in sizes}
    assert rec.active == 0


def test_capture_graphs_stops_when_the_gpu_runs_out_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm-up must not take the daemon down: sizes that run out of memory are skipped, the
    smaller ones still captured."""
    import torch

    rec = Recognizer(random_model(), capacity=40)
    real = rec.step

    def step(streams: list[Stream]) -> object:
        if len(streams) > 16:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(streams)

    monkeypatch.setattr(rec, "step", step)
    sizes = rec.capture_graphs(40)
    assert sizes and max(sizes) == 16 and min(sizes) == 1 and rec.active == 0
    assert max(b - a for a, b in rec._parts(40)) <= 16  # later steps launch in parts that fitted


def test_capture_graphs_goes_no_higher_than_a_part() -> None:
    rec = Recognizer(random_model(), capacity=40, part_rows=12)
    assert rec.capture_graphs(40)[0] == 12


def _transcript(engine_results: list[object]) -> tuple[list[int], int]:
    tokens = [t for r in engine_results for t in r.tokens]  # type: ignore[attr-defined]
    return tokens, engine_results[-1].frame_end  # type: ignore[attr-defined]


def test_audio_and_an_end_arriving_while_a_step_runs() -> None:
    """While the device runs a launched step the engine takes in audio (even for a stream of that
    step), but an end waits for the step's results: the stream's results come in order, cover
    all its audio, and equal those of the same audio sent at once."""
    audio = np.random.default_rng(3).standard_normal(16000 * 4).astype(np.float32) * 0.1
    head, tail = audio[:16000 * 3], audio[16000 * 3:]  # the head holds a first chunk at any right context

    async def run(split: bool) -> list[object]:
        rec = Recognizer(random_model(seed=1), capacity=2)
        engine = Engine(rec, max_batch=2, batch_wait_s=0.0)
        engine.start()
        real_launch = rec.launch
        try:
            session = await engine.open()
            if split:
                def launch(streams: list[Stream]) -> object:
                    launched = real_launch(streams)
                    if rec.launch is launch:  # the first step: the rest arrives while it runs
                        rec.launch = real_launch  # type: ignore[method-assign]
                        engine.push(session, tail)
                        engine.end(session)
                    return launched

                rec.launch = launch  # type: ignore[method-assign, assignment]
                engine.push(session, head)
            else:
                engine.push(session, audio)
                engine.end(session)
            results = []
            while (item := await session.results.get()) is not None:
                results.append(item)
            return results
        finally:
            await engine.stop()

    split, whole = asyncio.run(run(True)), asyncio.run(run(False))
    assert len(split) >= 2 and all(not isinstance(r, Exception) for r in split)
    assert _transcript(split) == _transcript(whole)
    assert _transcript(whole)[1] == 16000 * 4 // 160 // 8 + 1  # every encoder frame of the audio decoded


def test_the_engine_migrates_itself_and_keeps_serving_on_failure() -> None:
    """`Engine.migrate`: a move to a device that does not exist fails and changes nothing; a move
    to bf16 mid-stream swaps the model in between steps (the status says cutting over while it
    does, and listeners hear of it), and the stream's results go on to its last frame."""
    master = random_model(seed=2)
    audio = np.random.default_rng(4).standard_normal(16000 * 4).astype(np.float32) * 0.1

    async def main() -> None:
        rec = Recognizer(copy.deepcopy(master), capacity=2)
        engine = Engine(rec, max_batch=2, batch_wait_s=0.0)
        seen: list[tuple[bool, str]] = []
        engine.add_listener(lambda: seen.append((engine.status.cutting_over, engine.status.dtype)))
        engine.start()
        try:
            session = await engine.open()
            engine.push(session, audio[:16000 * 2])
            first = await session.results.get()
            assert first is not None

            bad = await engine.migrate(master, torch.device("cuda", 7), None)
            assert not bad.ok and bad.error and engine.status.device == "cpu" and engine.status.dtype == "fp32"
            assert seen == []  # nothing was cut over

            same = await engine.migrate(master, None, None)
            assert same.ok and not same.moved

            moved = await engine.migrate(master, None, torch.bfloat16)
            assert moved.ok and moved.moved and moved.streams == 1, moved
            assert engine.status.dtype == "bf16" and not engine.status.cutting_over
            assert seen == [(True, "fp32"), (False, "bf16")]

            engine.push(session, audio[16000 * 2:])
            engine.end(session)
            results = [first]
            while (item := await session.results.get()) is not None:
                results.append(item)
            assert all(not isinstance(r, Exception) for r in results)
            assert results[-1].frame_end == 16000 * 4 // 160 // 8 + 1  # type: ignore[union-attr]
        finally:
            await engine.stop()

    asyncio.run(main())


def test_step_times_report_where_the_engine_thread_went(caplog: pytest.LogCaptureFixture) -> None:
    times = StepTimes(every_s=3600.0)
    times.add(100, 0.010, 0.020, 0.005)
    assert times.steps == 1 and not caplog.records  # nothing logged before `every_s` has passed
    times.every_s = 0.0
    with caplog.at_level(logging.INFO, logger="streamd.engine"):
        times.add(300, 0.030, 0.040, 0.015)
    line = next(r.getMessage() for r in caplog.records if "steps in" in r.getMessage())
    assert "2 steps" in line and "mean batch 200" in line and "launch 20.0 ms," in line  # no wait for ring copies
    assert "(serving the front ends) 30.0 ms" in line and "results 10.0 ms" in line
    cpu = next(r.getMessage() for r in caplog.records if "ran on a CPU" in r.getMessage())
    assert "launching and delivering took" in cpu and "load average" in cpu  # GIL or core waits show here
    assert not any("GPU" in r.getMessage() for r in caplog.records)  # no step measured the device
    assert times.steps == 0 and times.launch_s == 0.0


def test_the_cpu_line_says_how_busy_the_hosts_cpus_were_and_what_was_stolen(tmp_path: Path,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    """`HostCpu`: from the kernel's counters between two reports, the host's CPUs' running share
    and the hypervisor's (steal); nothing said where the counters cannot be read."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n")
    times = StepTimes(every_s=0.0, host=HostCpu(str(stat)))
    # since: user +300, system +100, idle +400, iowait +0, steal +200 of 1000 ticks
    stat.write_text("cpu  400 0 150 1200 50 0 0 200 0 0\ncpu0 1 2 3\n")
    with caplog.at_level(logging.INFO, logger="streamd.engine"):
        times.add(10, 0.001, 0.001, 0.001)
    cpu = next(r.getMessage() for r in caplog.records if "ran on a CPU" in r.getMessage())
    assert cpu.endswith("; the host's CPUs 40 % busy, 20 % stolen by the hypervisor")
    assert HostCpu(str(tmp_path / "absent")).since_last() == ""


def test_step_times_report_the_gpus_own_time_when_steps_measured_it(caplog: pytest.LogCaptureFixture) -> None:
    times = StepTimes(every_s=3600.0, memory=lambda: "memory 1.0 GiB allocated, 2.0 reserved of 80")
    times.add(100, 0.010, 0.020, 0.005, gpu_s=0.030, ring_bytes=3_000_000, ring_wait_s=0.004)
    times.add(100, 0.010, 0.020, 0.005, gpu_s=None)  # e.g. the first step after a migration
    times.every_s = 0.0
    with caplog.at_level(logging.INFO, logger="streamd.engine"):
        times.add(200, 0.010, 0.020, 0.005, gpu_s=0.050, ring_bytes=1_000_000, ring_wait_s=0.005)
    step = next(r.getMessage() for r in caplog.records if "steps in" in r.getMessage())
    assert "launch 10.0 ms (3.0 of it waiting for the step before's ring copies)," in step  # 9 ms over 3 steps
    gpu = caplog.records[-1].getMessage()
    assert "the GPU worked 40.0 ms a step" in gpu and "(200.0 us a stream)" in gpu  # 80 ms over 400 streams
    assert "; 2.0 MB of audio rings copied to it a step;" in gpu  # 4 MB over the 2 steps that measured the GPU
    assert gpu.endswith("; memory 1.0 GiB allocated, 2.0 reserved of 80")
    assert times.gpu_s == 0.0 and times.gpu_steps == 0 and times.ring_bytes == 0 and times.ring_wait_s == 0.0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_the_gpu_line_says_the_serving_devices_memory(device: str) -> None:
    """On a GPU the engine's periodic report names the serving device's memory; on the CPU it
    has none to name."""
    engine = Engine(Recognizer(random_model().to(device), capacity=4), max_batch=4, batch_wait_s=0.0)
    memory = engine._device_memory()
    if device == "cpu":
        assert memory is None
    else:
        assert memory is not None and memory.startswith("memory ") and "GiB allocated" in memory


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_launched_step_says_how_long_the_device_worked_on_it(device: str) -> None:
    """On CUDA a collected step gives the device's time on it: positive, at most the wall time
    from its launch to its collection, and no more when the step before it on the device ended
    later than it started; off CUDA there is nothing to measure (None)."""
    import time

    rec = Recognizer(random_model().to(device), capacity=4)
    streams = [rec.open() for _ in range(4)]
    for s in streams:
        s.push_audio(np.random.default_rng(0).standard_normal(16000 * 4).astype(np.float32) * 0.1)
    t0 = time.perf_counter()
    first = rec.launch(streams)
    second = rec.launch([s for s in streams if s.ready])
    first.collect(), second.collect()
    wall = time.perf_counter() - t0
    if device == "cpu":
        assert first.device_s(None) is None and second.device_s(first) is None
        return
    alone, after = first.device_s(None), second.device_s(first)
    assert alone is not None and after is not None
    assert 0 < alone <= wall and 0 < after <= wall
    assert after <= second.device_s(None)  # type: ignore[operator]  # queued behind `first`: counted from its end


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_pipelined_steps_give_the_results_of_one_step_at_a_time(device: str) -> None:
    """With the next step launched while one is in flight (what the engine does on a GPU, here
    with the daemon's CUDA graphs): a stream with a backlog is in two steps at
    once, an end, a close or an open waits until no step is in flight, and a stream's `None`
    comes after its last result. Every stream's results equal those of one step at a time."""
    from streamd.decoding.graphs import make_decoder
    from streamd.engine.encoder_step import make_encoder_step

    rng = np.random.default_rng(5)
    audios = [rng.standard_normal(16000 * n).astype(np.float32) * 0.1 for n in (3, 4, 2, 3)]
    mode = "auto" if device == "cuda" else "eager"

    async def run(pipeline: bool) -> tuple[list[list[object]], list[int]]:
        rec = Recognizer(random_model(seed=1).to(device), capacity=4,
                         search_factory=lambda m: make_decoder(m, mode),
                         encoder_factory=lambda m: make_encoder_step(m, mode, 4))
        engine = Engine(rec, max_batch=4, batch_wait_s=0.0, pipeline=pipeline)
        in_flight_at_launch: list[int] = []
        real_launch = rec.launch

        def launch(streams: list[Stream]) -> object:
            in_flight_at_launch.append(len(engine._flight))
            return real_launch(streams)

        rec.launch = launch  # type: ignore[method-assign, assignment]
        engine.start()
        try:
            a, b, d = await engine.open(), await engine.open(), await engine.open()
            engine.push(d, audios[3])  # closed after a's first result: its slot goes to c
            engine.push(a, audios[0])  # a backlog of several steps
            engine.end(a)
            for piece in np.array_split(audios[1], 7):
                engine.push(b, piece)
            first = await a.results.get()
            engine.close(d)
            c = await engine.open()
            engine.push(c, audios[2])
            engine.end(c)
            engine.end(b)
            out = []
            for s, items in ((a, [first]), (b, []), (c, [])):
                while (item := await s.results.get()) is not None:
                    items.append(item)
                assert all(not isinstance(r, Exception) for r in items)
                out.append(items)
            return out, in_flight_at_launch
        finally:
            await engine.stop()

    (piped, flights), (serial, serial_flights) = asyncio.run(run(True)), asyncio.run(run(False))
    assert max(flights) == 1 and max(serial_flights) == 0  # steps did overlap, and only when asked
    for p, s in zip(piped, serial):
        assert len(p) > 1 and _transcript(p) == _transcript(s)  # tokens and the last frame decoded
        assert [r.frame_start for r in p[1:]] == [r.frame_end for r in p[:-1]]  # type: ignore[attr-defined]


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    """Wait until `check()` is true, at most `seconds` (the test's assertions say what then)."""
    for _ in range(int(seconds / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)


def held_steps(rec: Recognizer) -> threading.Event:
    """Make `rec`'s launched steps run on a "device" that finishes them only once the returned
    event is set (as a GPU step in flight)."""
    device_done = threading.Event()
    real_launch = rec.launch

    class SlowStep:
        ring_bytes, ring_wait_s = 0, 0.0

        def __init__(self, launched: object) -> None:
            self.launched = launched

        def done(self) -> bool:
            return device_done.is_set()

        def collect(self) -> object:
            return self.launched.collect()  # type: ignore[attr-defined]

        def device_s(self, previous: object) -> None:
            return None

    rec.launch = lambda streams: SlowStep(real_launch(streams))  # type: ignore[method-assign, assignment, return-value]
    return device_done


def test_named_jobs_do_not_drain_the_steps_in_flight() -> None:
    """A front end's status or /metrics text (`send`) and a new front end's channel (`add_source`)
    are taken in while a step is on the device: the pipeline is not drained for them, as it is
    for a `call` (which runs once no step is in flight)."""
    import socket

    rec = Recognizer(random_model(), capacity=2)
    device_done = held_steps(rec)
    engine = Engine(rec, max_batch=2, batch_wait_s=0.0, pipeline=True)
    sent: list[tuple[list[str], int]] = []  # (messages, steps in flight when they were handed over)
    read: list[int] = []  # steps in flight when the new source was served

    class Outlet:
        def send(self, messages: list[str]) -> None:
            sent.append((messages, len(engine._flight)))

    ours, theirs = socket.socketpair()
    ours.setblocking(False)

    class Source:
        wants_write = False

        def fileno(self) -> int:
            return ours.fileno()

        def readable(self) -> None:
            ours.recv(16)
            read.append(len(engine._flight))

        def writable(self) -> None:
            pass

        def close(self) -> None:
            ours.close()

    async def main() -> int:
        engine.start()
        try:
            session = await engine.open()
            engine.push(session, np.zeros(16000 * 3, dtype=np.float32))
            while not engine._flight:
                await asyncio.sleep(0.005)
            call = engine.submit(lambda r: len(engine._flight))
            engine.send(Outlet(), ["status"])
            engine.add_source(Source())
            theirs.send(b"x")
            await until(lambda: bool(sent and read))
            assert not call.done()  # held until the pipeline is empty
            device_done.set()
            flight_at_call = await asyncio.wrap_future(call)
            await asyncio.wrap_future(engine.detach([Source()]))
            return flight_at_call
        finally:
            device_done.set()
            await engine.stop()
            theirs.close()

    assert asyncio.run(main()) == 0
    assert sent and sent[0] == (["status"], sent[0][1]) and sent[0][1] > 0
    assert read and read[0] > 0


def test_engine_streams_are_numbered() -> None:
    """Every engine stream has an integer id, unique in its process (a front end numbers its own
    the same way: `RemoteEngine.open`)."""
    rec = Recognizer(random_model(), capacity=3)

    async def main() -> list[int]:
        engine = Engine(rec, max_batch=3, batch_wait_s=0.0)
        engine.start()
        try:
            first = await engine.open()
            engine.close(first)
            return [first.id] + [(await engine.open()).id for _ in range(3)]
        finally:
            await engine.stop()

    ids = asyncio.run(main())
    assert all(isinstance(i, int) and i >= 0 for i in ids) and len(set(ids)) == 4


def test_a_migration_reports_the_streams_failed_steps_ended_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that fails while a move is prepared ends its streams: the move itself may go well,
    but its report says how many streams were lost meanwhile (the H200 runs of 2026-12-05 lost
    thousands behind moves that reported ok), and a move with no failure reports 0."""
    master = random_model(seed=2)
    audio = np.random.default_rng(5).standard_normal(16000 * 2).astype(np.float32) * 0.1

    async def main() -> None:
        rec = Recognizer(copy.deepcopy(master), capacity=2)
        engine = Engine(rec, max_batch=2, batch_wait_s=0.0)
        engine.start()
        real_copy, real_launch = migration.placed_copy, rec.launch
        try:
            session = await engine.open()

            def broken(streams: list[Stream]) -> object:
                raise RuntimeError("CUDA error: dependency created on uncaptured work in another stream")

            def copy_while_a_step_fails(*args: object) -> object:  # on the migration thread
                rec.launch = broken  # type: ignore[method-assign, assignment]
                engine.push(session, audio)
                deadline = time.monotonic() + 30
                while engine.streams_failed == 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
                rec.launch = real_launch  # type: ignore[method-assign]
                return real_copy(*args)  # type: ignore[arg-type]

            monkeypatch.setattr(migration, "placed_copy", copy_while_a_step_fails)
            report = await engine.migrate(master, None, torch.bfloat16)
            assert report.ok and report.streams_failed == 1, report
            assert isinstance(await session.results.get(), Exception)
            monkeypatch.setattr(migration, "placed_copy", real_copy)
            again = await engine.migrate(master, None, torch.float32)
            assert again.ok and again.streams_failed == 0, again
        finally:
            await engine.stop()

    asyncio.run(main())


def test_a_front_ends_message_is_taken_as_its_pieces_one_by_one() -> None:
    """`Engine.take_pieces` (a front end's `StreamAudio`, taken on the engine thread in a few
    numpy calls) queues each piece as `take_audio` does one at a time: a stream twice in one
    message, an empty piece, a stream the front end no longer knows (None) and one whose slot
    is gone are all handled; the same streams become ready, with the same samples."""
    from streamd.engine.types import EngineSession
    from streamd.server.channel import HEADER, _frame, _load
    from streamd.server.link import StreamAudio

    engines = [Engine(Recognizer(random_model(), capacity=4), max_batch=4, batch_wait_s=0.0) for _ in range(2)]
    sessions = [[EngineSession(id=i) for i in range(4)] for _ in engines]
    for engine, mine in zip(engines, sessions):
        for s in mine:
            engine._open(s)
        engine._release(mine[2])  # closed: its pieces are dropped
    chunk = engines[0].recognizer.geometry.samples_for(engines[0].recognizer.geometry.new_frames(True))
    rng = np.random.default_rng(3)
    (one, many), (mine_one, mine_many) = engines, sessions
    # the second message has a stream twice
    for order, sizes in (([3, 1, 2, None, 0], [chunk // 2, 0, 500, 700, chunk - 1]), ([3, 0, 3], [400, 0, chunk])):
        samples = rng.standard_normal(sum(sizes)).astype(np.float32)
        at = 0
        for i, n in zip(order, sizes):
            if i is not None:
                one.take_audio(mine_one[i], samples[at: at + n])
            at += n
        frame = b"".join(_frame([StreamAudio(list(range(len(order))), sizes, samples)]))  # as the bridge reads it
        message = _load(bytearray(frame[HEADER.size:]), HEADER.unpack_from(frame)[1])[0]
        many.take_pieces([mine_many[i] if i is not None else None for i in order], message.sizes, message.samples)
    assert [s.id for s in many._ready_set] == [s.id for s in one._ready_set] == [3]
    a, b = one.recognizer.audio, many.recognizer.audio
    np.testing.assert_array_equal(a.samples, b.samples)
    np.testing.assert_array_equal(a.rows, b.rows)
    assert b.samples[mine_many[0].stream.slot] == chunk - 1
    assert b.samples[mine_many[3].stream.slot] == chunk // 2 + 400 + chunk


def test_an_engine_thread_blocked_in_a_step_is_reported_with_its_stack(caplog: pytest.LogCaptureFixture) -> None:
    """A step that never returns (a CUDA call that blocks, a deadlock) while streams wait: the
    engine says it stalled and where its thread is; the daemon's watchdog task logs that once and
    stops feeding systemd's watchdog (so systemd restarts the daemon), and feeds it again once
    steps go on."""
    import threading

    from streamd.server import app

    release = threading.Event()
    rec = Recognizer(random_model(), capacity=4)
    real_launch = rec.launch

    def launch_that_blocks(streams: list[Stream]) -> object:
        release.wait(30)
        return real_launch(streams)

    fed: list[float] = []

    class Notifier:
        watchdog_interval = 0.05

        def watchdog(self) -> bool:
            fed.append(time.monotonic())
            return True

    async def main() -> None:
        engine = Engine(rec, max_batch=4, batch_wait_s=0.0)
        engine.start()
        try:
            session = await engine.open()
            assert engine.stalled(0.0) is None  # nothing waits: an idle engine is not stalled
            rec.launch = launch_that_blocks  # type: ignore[method-assign]
            engine.push(session, np.zeros(rec.geometry.samples_for(rec.geometry.frames_after(1)), np.float32))
            watchdog = asyncio.ensure_future(app._watchdog(Notifier(), engine, stall_s=0.3))  # type: ignore[arg-type]
            await asyncio.sleep(0.8)
            stall = engine.stalled(0.3)
            assert stall is not None and "launch_that_blocks" in stall and "release.wait" in stall
            assert engine.status.stalled  # the front ends answer /livez and /readyz with 503
            fed_while_stalled = len(fed)
            await asyncio.sleep(0.3)
            assert len(fed) == fed_while_stalled  # no longer fed
            release.set()
            assert await asyncio.wait_for(session.results.get(), 30) is not None
            await asyncio.sleep(0.3)
            assert engine.stalled(0.3) is None and len(fed) > fed_while_stalled  # fed again
            assert not engine.status.stalled
            watchdog.cancel()
        finally:
            release.set()
            await engine.stop()

    with caplog.at_level(logging.ERROR, logger="streamd.server"):
        asyncio.run(main())
    stalls = [r.getMessage() for r in caplog.records if "engine stalled" in r.getMessage()]
    assert len(stalls) == 1 and "no longer feeding systemd's watchdog" in stalls[0] and "launch_that_blocks" in stalls[0]


def test_a_call_or_open_whose_awaiter_gave_up_is_skipped_and_the_engine_serves_on() -> None:
    """A coroutine cancelled while its `Engine.call`, `Engine.open` or `Engine.detach` waits in the
    inbox (a stop during the start's capacity probe, an admin client gone, a stop's timeout) cancels
    the future the engine thread would answer: the engine skips the call and the open (a detach is
    still done) and serves on, where answering the future would raise on its thread."""
    rec = Recognizer(random_model(), capacity=3)
    ran: list[str] = []

    async def main() -> int:
        engine = Engine(rec, max_batch=3, batch_wait_s=0.0)
        engine.start()
        try:
            busy, release = threading.Event(), threading.Event()
            first = asyncio.ensure_future(engine.call(lambda r: (busy.set(), release.wait(5))))
            await asyncio.to_thread(busy.wait, 5)
            given_up = [asyncio.ensure_future(engine.call(lambda r: ran.append("call"))),
                        asyncio.ensure_future(engine.open()),
                        asyncio.ensure_future(asyncio.wrap_future(engine.detach([])))]  # a stop's timed-out wait
            await asyncio.sleep(0.05)  # all posted behind the busy call
            for task in given_up:
                task.cancel()
            await asyncio.gather(*given_up, return_exceptions=True)  # their engine futures cancelled by now
            release.set()
            await first
            session = await asyncio.wait_for(engine.open(), 10)  # the engine thread still answers
            assert engine.error is None
            return session.id
        finally:
            await engine.stop()

    assert asyncio.run(main()) >= 0
    assert ran == []
