"""scripts/bench_capacity.py's live item: the daemon's own engine, alone, keeps N streams live with
churn (streams end and new ones open) and reports each level's streams and steps; its daemon
levels can churn the same way (`--daemon-churn`). And scripts/load.py's word when no daemon answers."""
from __future__ import annotations

import socket
import sys
import time

import numpy as np
import pytest

from conftest import FIXTURES, REPO

sys.path.insert(0, str(REPO / "scripts"))
import bench_capacity  # noqa: E402
from streamd.engine.recognizer import PART_ROWS  # noqa: E402
from streamd.engine.types import EngineSession, StepResults  # noqa: E402
from streamd.server.channel import HEADER, _load  # noqa: E402


def test_live_level_churns_and_reports() -> None:
    model = FIXTURES / "tiny_streaming_fastconformer_hybrid.nemo"
    args = bench_capacity.parse_args(["--device", "cpu", "--model", str(model), "--plan", "live:160:fp32:off",
                                      "--live-at", "160=4", "--stream-s", "0.5", "--live-s", "2", "--warmup-s", "0.5"])
    item = args.items[0]
    switch = sys.getswitchinterval()
    result = bench_capacity.live_capacity(model, item, 4, args, seconds=60)
    assert sys.getswitchinterval() == switch  # the daemon's, set by the engine, is undone
    [level] = result["levels"]
    assert level["streams"] == 4
    assert level["opened"] > 4 + 4 * 2 / 0.5 / 2  # about 4 / 0.5 s open per second after the first 4
    assert level["drain_s"]["n"] == level["opened"]  # every stream ended and was flushed
    assert level["steps"]["count"] > 0 and level["steps"]["mean_batch"] > 0
    lat = level["result_latency_s"]["p95"]
    assert level["passed"] == (level["kept_up"] == level["opened"] and not level["errors"]
                               and not level["client_bound"] and lat is not None and lat <= result["max_latency_s"])
    if not level["passed"]:  # a busy CI machine: then the report says which streams fell behind
        assert level["kept_up"] < level["opened"] or level["client_bound"] or lat > result["max_latency_s"]
    table = bench_capacity.levels_table([{"part": "live", "chunk_ms": 160, "dtype": "fp32", "graphs": "off",
                                          **result}])
    assert f"{level['opened']:7d} {level['kept_up']:7d}" in table.splitlines()[1]


def test_engine_levels_are_stepped_pipelined_and_alone() -> None:
    """The engine item passes a level on its pipelined steps (as the daemon's engine steps) and
    reports the synchronised step beside it; levels double from the first."""
    model = FIXTURES / "tiny_streaming_fastconformer_hybrid.nemo"
    args = bench_capacity.parse_args(["--device", "cpu", "--model", str(model), "--plan", "engine:160:fp32:off",
                                      "--engine-start", "2", "--engine-max", "4", "--engine-refine", "0"])
    result = bench_capacity.engine_capacity(model, args.items[0], args, seconds=60)
    rows = result["probes"]
    assert [r["streams"] for r in rows] == [2, 4][:len(rows)] and rows[0]["steps"] == 5
    for r in rows:
        assert r["step_s"] > 0 and r["unpipelined_step_s"] > 0 and r["passed"] == (r["step_s"] <= result["chunk_s"])
        assert r["queued"] == 0  # fed as real-time clients feed: no stream's audio waits outside its ring
        host = r["pipelined"]  # the host's parts of a pipelined step (no device time on the CPU)
        assert set(host) == {"feed_s", "launch_s", "ring_wait_s", "collect_s", "deliver_s"}
        assert host["launch_s"] > 0 and host["ring_wait_s"] == 0 and r["pipelined_steps"] == 8
    assert result["capacity"] == max([r["streams"] for r in rows if r["passed"]], default=0)
    assert result["part_rows"] == PART_ROWS


def test_engine_levels_deliver_results_as_the_daemon_to_its_front_ends() -> None:
    """With front ends, a landed step leaves the engine item as the daemon's engine thread sends
    it: one framed `Results` a front end, whose rows are that front end's streams' results."""
    labels = np.arange(5 * 3, dtype=np.int64).reshape(5, 3)
    results = StepResults(labels, labels + 100, np.array([0, 1, 3, 2, 0]), np.arange(5), np.arange(5) + 2)
    sessions = [EngineSession(id=100 + i) for i in range(5)]
    frames = bench_capacity.deliver(results, sessions, 2)
    got = {}
    for frame in frames:
        body = b"".join(bytes(part) for part in frame)
        (message,) = _load(bytearray(body[HEADER.size:]), HEADER.unpack_from(body)[1])
        got.update(message.items())
    assert got == {100 + i: chunk for i, chunk in enumerate(results.chunks())}  # each stream's own row
    assert bench_capacity.deliver(results, sessions, 0) == results.chunks()  # in-process sessions: the chunks


def test_engine_levels_step_in_parts_of_the_rows_asked() -> None:
    model = FIXTURES / "tiny_streaming_fastconformer_hybrid.nemo"
    args = bench_capacity.parse_args(["--device", "cpu", "--model", str(model), "--plan", "engine:160:fp32:off",
                                      "--engine-start", "4", "--engine-max", "4", "--engine-refine", "0",
                                      "--part-rows", "2"])
    result = bench_capacity.engine_capacity(model, args.items[0], args, seconds=60)
    assert result["part_rows"] == 2 and result["probes"][0]["streams"] == 4


def test_daemon_step_quantiles_are_bucket_bounds() -> None:
    inf = float("inf")
    before = {0.01: 5.0, 0.02: 5.0, 0.04: 5.0, inf: 5.0}  # steps before the level do not count
    after = {0.01: 15.0, 0.02: 24.0, 0.04: 25.0, inf: 25.0}
    assert bench_capacity.bucket_quantiles(before, after) == {"p50": 0.01, "p95": 0.02}
    assert bench_capacity.bucket_quantiles({}, {0.01: 0.0, inf: 4.0}) == {"p50": "> 0.01", "p95": "> 0.01"}
    assert bench_capacity.bucket_quantiles(after, after) == {"p50": None, "p95": None}


def test_daemon_churn_opens_new_connections() -> None:
    """`--daemon-churn`: each client slot streams back to back through a real daemon, so more
    streams open than the level holds, and each one ends with its summary."""
    import load

    daemon = load.Daemon(str(FIXTURES / "tiny_streaming_fastconformer_hybrid.nemo"), "cpu", "fp32", 16,
                         ["--right-context", "1", "--cuda-graphs", "off", "--admission", "max_streams"])
    try:
        url = daemon.wait_serving(timeout=120)
        stats, cpu_s = bench_capacity.churn_worker(url, [0, 1, 2], 3, [load.tone_bursts(seconds=2.0)], stream_s=0.5,
                                                   level_s=2.0, send_s=0.1, start_at=time.time() + 0.2)
        steps = bench_capacity.step_buckets(url)  # what a level reports beside the clients' view
        paths = bench_capacity.labelled(url, bench_capacity.AUDIO_MESSAGES)
    finally:
        daemon.stop()
    per_slot = [sum(s["index"] == i for s in stats) for i in range(3)]
    assert min(per_slot) >= 2  # each slot's first stream (at most 0.5 s), then more until 2 s
    assert all(s["error"] is None and s["drain"] is not None for s in stats)
    assert cpu_s > 0
    assert steps[float("inf")] > 0 and steps == dict(sorted(steps.items()))  # every step, in buckets' order
    assert set(paths) == {"shared", "inline"}  # no front ends (--workers 0): none sent, both counted as 0
    assert not any(paths.values())


def test_level_search_runs_the_asked_levels_or_bisects() -> None:
    """Asked levels run in order whatever each gave; else up to the top, then halfway between
    the best passing and the worst failing level, until no new level is 5 % away."""
    asked = bench_capacity.LevelSearch.around([64, 32, 128], guess=100, share=0.5)
    assert (asked.first, asked.top) == (64, 128)
    assert [asked.record(n, {"streams": n, "passed": ok}) for n, ok in ((64, False), (32, True), (128, True))] \
        == [32, 128, None]
    assert (asked.best, asked.worst) == (128, 64)  # as measured, even where they disagree
    twice = bench_capacity.LevelSearch.around([64, 64, 128, 128], guess=100, share=0.5)
    for n, ok in ((64, True), (64, True), (128, True), (128, False)):  # 128 passed once, then not
        twice.record(n, {"streams": n, "passed": ok})
    assert (twice.best, twice.worst) == (64, 128)  # a level counts as passed only if it passed every time
    runs = [{"streams": 64, "partial_latency_s": {"p95": p95}, "load_generator": {"processes": 2, "cores_used": 0.5}}
            for p95 in (0.12, 0.31, 0.2)]
    table = bench_capacity.summary_table([{"part": "daemon", "chunk_ms": 160, "dtype": "bf16", "graphs": "on",
                                           "capacity": 64, "first_failing": 128, "levels": runs}])
    assert "64 (0.31, 2/0.5)" in table.splitlines()[1]  # the slowest of the runs at the capacity's level
    runs[1]["partial_latency_s"]["p95"] = None  # a run without partial results (it passed on finals alone)
    table = bench_capacity.summary_table([{"part": "daemon", "chunk_ms": 160, "dtype": "bf16", "graphs": "on",
                                           "capacity": 64, "first_failing": 128, "levels": runs}])
    assert "64 (0.20, 2/0.5)" in table.splitlines()[1]
    runs[0]["partial_latency_s"]["p95"] = runs[2]["partial_latency_s"]["p95"] = None
    table = bench_capacity.summary_table([{"part": "daemon", "chunk_ms": 160, "dtype": "bf16", "graphs": "on",
                                           "capacity": 64, "first_failing": 128, "levels": runs}])
    assert "64 (-, 2/0.5)" in table.splitlines()[1]
    search, ran = bench_capacity.LevelSearch.around([], guess=1024, share=0.25), []
    n: int | None = search.first
    while n is not None:  # the engine keeps up with up to 600 streams
        ran.append(n)
        n = search.record(n, {"streams": n, "passed": n <= 600})
    assert ran == [256, 1024, 640, 448, 544, 592] and (search.best, search.worst) == (592, 640)
    assert all(lv["passed"] == (lv["streams"] <= 600) for lv in search.levels)
    beyond, ran = bench_capacity.LevelSearch.around([], guess=1024, share=0.5, above=1.5), []
    n = beyond.first
    while n is not None:  # the daemon serves 1300 streams, more than the unpipelined engine's 1024
        ran.append(n)
        n = beyond.record(n, {"streams": n, "passed": n <= 1300})
    assert ran[:2] == [512, 1536] and beyond.best == max(r for r in ran if r <= 1300) >= 1200


def test_load_against_a_daemon_that_is_down_says_so_in_one_line() -> None:
    import load

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SystemExit) as stopped:
        load.scrape(f"ws://127.0.0.1:{port}")
    assert str(stopped.value).startswith(f"load.py: no streamd daemon answered http://127.0.0.1:{port}/metrics")
