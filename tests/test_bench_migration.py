"""`scripts/bench_migration.py`: its wait for a move ends as soon as the daemon says its engine
stalled (`/livez` 503), not at `--move-timeout` (a hung move held a device call for five minutes);
token differences are placed, and set beside a second unmoved run's with --control; the share of
calls that ran eagerly after a move is read off two statuses; a client process accounts for its
own CPU and how late its event loop woke."""
from __future__ import annotations

import asyncio
import http.server
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import bench_migration  # noqa: E402
from streamd.admin_client import AdminError  # noqa: E402


@contextmanager
def livez(code: int) -> Iterator[str]:
    """A server whose /livez answers `code`; yields its ws:// URL."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(code)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"ws://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_stalled_is_what_livez_says() -> None:
    with livez(503) as url:
        assert bench_migration.stalled(url)
    with livez(200) as url:
        assert not bench_migration.stalled(url)
    assert not bench_migration.stalled(f"ws://127.0.0.1:{free_port()}")  # no answer: the timeout decides


def test_a_move_wait_ends_when_the_engine_stalls(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def hangs(*args: Any) -> dict[str, Any]:
        release.wait(30)
        return {"ok": True}

    monkeypatch.setattr(bench_migration, "admin", hangs)
    monkeypatch.setattr(bench_migration, "LIVEZ_EVERY_S", 0.05)
    try:
        with livez(503) as url:
            t = time.monotonic()
            with pytest.raises(AdminError, match="engine stalled"):
                bench_migration.migrate(Path("unused.sock"), url, {}, timeout=30)
            assert time.monotonic() - t < 5
        with livez(200) as url:
            t = time.monotonic()
            with pytest.raises(AdminError, match="timed out"):
                bench_migration.migrate(Path("unused.sock"), url, {}, timeout=0.3)
            assert time.monotonic() - t < 5
            monkeypatch.setattr(bench_migration, "admin", lambda *args: {"ok": True, "migration": {}})
            assert bench_migration.migrate(Path("unused.sock"), url, {}, timeout=5) == {"ok": True, "migration": {}}
    finally:
        release.set()


def test_a_token_difference_is_placed_on_the_placement_that_served_it() -> None:
    """A stream that started at wall time 100; moves cut over at 110 (to the CPU) and 120 (back)."""
    cuts = [(110.0, "cpu/fp32"), (120.0, "cuda:0/fp32")]
    finals = [(4.0, 3), (12.0, 6), (25.0, 9)]  # audio second of each final, tokens so far
    first = bench_migration.first_difference
    on_cpu = first(7, [1, 2, 3, 4, 5, 9, 7], [1, 2, 3, 4, 5, 6, 7], 100.0, finals, "cuda:0/fp32", cuts)
    assert on_cpu == {"stream": 7, "token": 5, "tokens": [7, 7], "audio_s": 12.0, "served_on": "cpu/fp32"}
    before = first(1, [0, 2], [1, 2], 100.0, finals, "cuda:0/fp32", cuts)
    assert before["token"] == 0 and before["served_on"] == "cuda:0/fp32 (before the first move)"
    longer = first(2, list(range(9)), list(range(7)), 100.0, finals, "cuda:0/fp32", cuts)
    assert longer["token"] == 7 and longer["audio_s"] == 25.0 and longer["served_on"] == "cuda:0/fp32"


def test_streams_loop_the_audio_files_given_in_turn() -> None:
    speech = sorted(str(p) for p in (REPO / "tests" / "fixtures" / "real-speech").glob("*.ogg"))[:2]
    feed = bench_migration.Feed(seconds=20.0, send_s=0.1, files=tuple(speech))
    first, pcm = feed.audio(0)
    assert first.name == Path(speech[0]).name and feed.audio(3)[0].name == Path(speech[1]).name
    assert len(pcm) / 2 / first.rate >= 20.0
    bursts = bench_migration.Feed(seconds=5.0, send_s=0.1)
    assert bursts.audio(1)[0].pcm == bench_migration.Feed(5.0, 0.1).audio(17)[0].pcm  # seed 1 both


def test_the_control_run_says_how_many_streams_two_unmoved_runs_share(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """With --control the unmoved daemon runs twice: the report has the moved run against the
    first, and the two unmoved runs against each other (what batches alone change)."""
    runs = {"moved": {0: [1, 2], 1: [3], 2: [4, 4]}, "unmoved": {0: [1, 2], 1: [3], 2: [4, 5]},
            "unmoved-again": {0: [1, 2], 1: [3, 3], 2: [4, 5]}}

    def run_daemon(args: Any, model: Path, moves: list[str], tag: str, seconds: float, stop_early: bool) -> dict[str, Any]:
        return {"moves": [], "latency_before_moves": {}, "load_generator": {}, "streams_dropped": 0, "dropped": [],
                "errors": [], "tokens": runs[tag], "timeline": {i: (0.0, [(1.0, 9)]) for i in runs[tag]}}

    monkeypatch.setattr(bench_migration, "run_daemon", run_daemon)
    monkeypatch.setattr(bench_migration, "machine", lambda: {})
    model = tmp_path / "m.pt"
    model.touch()
    parsed = bench_migration.parse_args(["--model", str(model), "--start", "cuda:0/fp32", "--moves", "cpu/fp32,cuda:0/fp32"])
    out = bench_migration.run(parsed)
    assert out["tokens_identical_to_unmoved"] == "2 of 3" and "unmoved_runs_identical" not in out
    parsed.control = True
    out = bench_migration.run(parsed)
    assert out["tokens_identical_to_unmoved"] == "2 of 3" and out["unmoved_runs_identical"] == "2 of 3"


def test_the_eager_share_after_a_move_is_read_off_two_statuses() -> None:
    before = {"calls": 100, "eager_calls": {"encoder": 10, "decoder": 0}}
    after = {"calls": 140, "eager_calls": {"encoder": 20, "decoder": 2}}
    assert bench_migration.eager_share(before, after) == {"calls": 40, "encoder": 0.25, "decoder": 0.05}
    assert bench_migration.eager_txt(bench_migration.eager_share(before, after)) == "25/5 %"
    assert bench_migration.eager_share(before, before) is None  # no call between
    assert bench_migration.eager_share({}, after) is None  # a daemon without the counters
    assert bench_migration.eager_txt(None) == "-"
    before["padded_calls"], after["padded_calls"] = {"encoder": 0, "decoder": 0}, {"encoder": 8, "decoder": 0}
    assert bench_migration.eager_share(before, after) == {"calls": 40, "encoder": 0.25, "decoder": 0.05,
                                                          "padded": {"encoder": 0.2, "decoder": 0.0}}


@contextmanager
def stream_server() -> Iterator[str]:
    """A websocket server, on an event loop in a thread of its own, that answers a stream's `stop`
    with a summary; yields its ws:// URL."""
    loop = asyncio.new_event_loop()
    started, port = threading.Event(), []
    done = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        async for message in ws:
            if isinstance(message, str) and json.loads(message)["type"] == "stop":
                await ws.send(json.dumps({"type": "summary"}))
                await ws.close()

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, compression=None) as server:
            port.append(server.sockets[0].getsockname()[1])
            started.set()
            await done.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield f"ws://127.0.0.1:{port[0]}"
    finally:
        loop.call_soon_threadsafe(done.set)
        thread.join(10)


def test_a_client_process_accounts_for_its_cpu_and_its_loop_s_lateness(monkeypatch: pytest.MonkeyPatch) -> None:
    real_client = bench_migration.client

    async def client_that_blocks(*args: Any) -> dict[str, Any]:
        log = await real_client(*args)
        time.sleep(0.3)  # blocks the client process's event loop, as a saturated process would
        return log

    monkeypatch.setattr(bench_migration, "client", client_that_blocks)
    with stream_server() as url:
        logs, account = bench_migration.client_process(url, [0, 1], bench_migration.Feed(1.0, 0.1), time.time(), 0.1,
                                                       None)
    assert [log["closed"] for log in logs] == [1000, 1000] and all(log.get("summary") for log in logs)
    assert 0 < account["cpu_s"] and account["wall_s"] >= 1.0
    assert account["lateness"] and max(late for _, late in account["lateness"]) >= 0.19  # 0.3 s less a tick at most
