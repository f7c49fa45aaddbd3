"""The shared client pieces: URLs, retry decisions, the live display, the progress bar, imports."""
from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import time

import pytest
from websockets.asyncio.server import ServerConnection, serve

from conftest import REPO
from streamd.clients.common import (Backoff, ConnectionLost, LiveDisplay, ServerBusy, StreamError, format_time,
                                    retry_delay, stream_url)
from streamd.clients.progress import Progress
from streamd.clients.resume import ResumingStream
from streamd.protocol import Start


def test_stream_url_adds_the_protocol_path() -> None:
    assert stream_url("ws://127.0.0.1:8765") == "ws://127.0.0.1:8765/v1/stream"
    assert stream_url("wss://asr.example:443/") == "wss://asr.example:443/v1/stream"
    assert stream_url("ws://h:1/v1/stream?x=1") == "ws://h:1/v1/stream?x=1"
    with pytest.raises(ValueError):
        stream_url("http://127.0.0.1:8765")


def test_backoff_doubles_up_to_the_maximum() -> None:
    b = Backoff(initial=0.5, maximum=4.0, jitter=0.0)
    assert [b.next() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]


def test_retry_only_what_a_new_connection_can_fix() -> None:
    b = Backoff(jitter=0.0)
    assert retry_delay(ConnectionRefusedError(), b) == 0.5
    assert retry_delay(ConnectionLost(1006), b) == 1.0
    assert retry_delay(StreamError("overloaded", "full"), b) == 2.0
    assert retry_delay(ServerBusy(retry_after=5.0), b) == 5.0  # the server's Retry-After wins
    for fatal in ("protocol_violation", "unsupported_audio", "unauthorized", "forbidden"):
        assert retry_delay(StreamError(fatal, "no"), b) is None
    assert retry_delay(ValueError("bad URL"), b) is None


def test_format_time() -> None:
    assert format_time(0) == "00:00.000"
    assert format_time(83.4567) == "01:23.457"
    assert format_time(3723.5) == "1:02:03.500"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_display_rewrites_one_partial_line_and_prints_finals_on_their_own() -> None:
    out, err = Terminal(), io.StringIO()
    d = LiveDisplay(out, err)
    d.partial("turn the")
    d.partial("turn the lights")
    d.final("turn the lights off", 0.32, 1.6)
    d.partial("x" * 1000)  # longer than any terminal: the tail, on one line
    d.status("reconnecting")
    d.final("", 2.0, 2.0)  # empty finals are not printed
    screen = out.getvalue()
    assert screen.startswith("\r\x1b[Kturn the\r\x1b[Kturn the lights\r\x1b[K")
    assert "[00:00.320 --> 00:01.600] turn the lights off\n" in screen
    assert screen.count("\n") == 1 and "…xxx" in screen
    assert err.getvalue() == "reconnecting\n"
    assert d.finals == 1  # what `listen` counts when it stops: the finals with text


def test_display_on_a_pipe_prints_finals_only() -> None:
    out, err = io.StringIO(), io.StringIO()
    d = LiveDisplay(out, err)
    d.partial("turn the")
    d.final("turn the lights off", 0.32, 1.6)
    assert out.getvalue() == "[00:00.320 --> 00:01.600] turn the lights off\n"


def test_progress_bar() -> None:
    out = Terminal()
    p = Progress([3.0, 1.0], out, enabled=True)
    p.update(0, 1.5)
    assert p.line() == f"[{'#' * 11}{'-' * 19}]  38%  1.5/4.0 s  0/2 files"
    p.done(0)
    p.done(1)
    assert out.getvalue().endswith(f"[{'#' * 30}] 100%  4.0/4.0 s  2/2 files")
    p.clear()
    assert out.getvalue().endswith("\r\x1b[K")
    quiet = io.StringIO()
    Progress([1.0], quiet, enabled=False).done(0)
    assert quiet.getvalue() == ""


def test_clients_never_import_torch() -> None:
    code = ("import sys, streamd.cli, streamd.clients.mic, streamd.clients.file;"
            "streamd.cli.build_parser();"
            "import json; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []
    for command in ("listen", "transcribe"):
        helped = subprocess.run([sys.executable, "-X", "importtime", "-m", "streamd", command, "--help"], cwd=REPO,
                                capture_output=True, text=True, check=True)
        assert "torch" not in helped.stderr


def test_a_refusal_says_whether_the_daemon_drains_or_is_full() -> None:
    assert "draining" in ServerBusy(5.0, b"draining\n").message
    assert "full" not in ServerBusy(5.0, b"draining\n").message
    assert "at capacity" in ServerBusy(1.0, b"at capacity\n").message
    assert "full or draining" in ServerBusy(1.0, b"<html>503</html>").message  # a proxy's page: not echoed


def test_a_server_that_takes_the_connection_but_never_answers_is_an_error_not_a_wait() -> None:
    """Not a streamd daemon, or one that hangs: `start` gets no `ready`. The stream ends with a
    StreamError that says so within `open_timeout` (it used to wait for ever), and a new
    connection may help (a daemon that hung a while)."""
    async def main() -> None:
        async def mute(ws: ServerConnection) -> None:
            async for _ in ws:
                pass

        async with serve(mute, "127.0.0.1", 0, compression=None) as server:
            url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            t = time.monotonic()
            with pytest.raises(StreamError) as exc:
                async with ResumingStream(url, Start(sample_rate=16000, encoding="s16le"), open_timeout=0.5):
                    pass
            assert time.monotonic() - t < 5
            assert exc.value.code == "no_answer" and "did not answer `start` in 0.5 s" in exc.value.message
            assert "is it a streamd daemon" in exc.value.message
            assert retry_delay(exc.value, Backoff()) is not None

    asyncio.run(main())
