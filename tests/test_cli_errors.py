"""What the user meets when a start or a command cannot work: one line naming the cause, exit 2,
no traceback, and for a port in use before the model is loaded (or taken while it loaded)."""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES
from streamd import cli
from streamd.admin_client import _summary
from streamd.errors import ConfigError
from streamd.server.app import App, build_state
from streamd.server.metrics import Metrics

WAV = FIXTURES / "in3_espeak_sentence.wav"


def one_line_error(text: str) -> str:
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize("where", ["stream", "admin"])
def test_a_port_in_use_is_said_before_the_model_loads(tmp_path: Path, where: str) -> None:
    not_a_model = tmp_path / "model.nemo"
    not_a_model.write_text("loading this would fail: the port check must come first\n")
    token = tmp_path / "token"
    token.write_text("secret\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        flags = (["--port", port] if where == "stream"
                 else ["--port", "0", "--admin-port", port, "--admin-token-file", str(token)])
        p = subprocess.run([sys.executable, "-m", "streamd", "serve", "--host", "127.0.0.1", "--admin-host",
                            "127.0.0.1", "--admin-socket", "", "--model", str(not_a_model), *flags],
                           capture_output=True, text=True, timeout=120)
    line = one_line_error(p.stderr)
    assert p.returncode == 2 and f"port {port} on 127.0.0.1 is already in use" in line, line
    assert ("--port" if where == "stream" else "--admin-port") in line


def test_a_file_that_is_not_a_model_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello\n" * 100)
    tar = tmp_path / "empty.nemo"
    subprocess.run(["tar", "-cf", str(tar), "-C", str(tmp_path), "notes.txt"], check=True)
    for model, words in ((text, "not a model streamd can read"), (tmp_path, "is a directory"),
                         (tar, "not a .nemo file"), (tmp_path / "gone.nemo", "no model file")):
        assert cli.main(["decode", "--model", str(model), str(WAV)]) == 2
        line = one_line_error(capsys.readouterr().err)
        assert line.startswith("streamd decode: error: ") and words in line, line


def test_admin_migrate_without_flags_names_the_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["admin", "--socket", str(tmp_path / "admin.sock"), "migrate"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "--device" in line and "--dtype" in line and '"device"' not in line, line


def test_admin_options_go_before_or_after_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parse = cli.build_parser().parse_args
    for argv in (["admin", "--json", "--socket", "/a", "status"], ["admin", "status", "--json", "--socket", "/a"],
                 ["admin", "--socket", "/b", "status", "--socket", "/a", "--json"]):
        args = parse(argv)
        assert (args.json, args.socket, args.url) == (True, "/a", None), argv
    assert parse(["admin", "--url", "http://h:9", "migrate", "--dtype", "bf16"]).url == "http://h:9"
    assert parse(["admin", "drain", "--exit"]).socket == parse(["admin", "status"]).socket  # the default, once
    missing = tmp_path / "admin.sock"
    assert cli.main(["admin", "status", "--json", "--socket", str(missing)]) == 1
    line = one_line_error(capsys.readouterr().err)
    assert f"no admin socket at {missing}" in line, line


def test_decode_names_what_is_wrong_with_each_file_and_goes_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty, junk = tmp_path / "empty.wav", tmp_path / "junk.wav"
    empty.write_bytes(b"")
    junk.write_bytes(b"RIFF????WAVEnot audio")
    files = [tmp_path / "missing.wav", tmp_path, empty, junk, WAV]
    assert cli.main(["decode", "--model", str(FIXTURES / "tiny_streaming_fastconformer_rnnt.nemo"),
                     *map(str, files)]) == 1
    out = capsys.readouterr()
    lines = [json.loads(line) for line in out.out.splitlines()]
    assert [line["file"] for line in lines] == [str(f) for f in files]  # every file, in order
    errors = [line.get("error", "") for line in lines]
    assert errors[0].endswith("no such file") and errors[1].endswith("is a directory, not an audio file")
    assert errors[2].endswith("empty file (0 bytes)") and "not an audio file" in errors[3]
    assert not any("System error" in e or "Format not recognised" in e for e in errors)
    assert "text" in lines[4] and len(out.err.splitlines()) == 4


STATUS = {"ok": True, "model": "m", "device": "cpu", "dtype": "fp32", "streams": 0, "capacity": 64,
          "admission_limit": 64, "capacity_estimate": 246, "chunk_ms": 1120, "encoder": "eager",
          "attention": "explicit", "decoder": "eager", "draining": False, "last_migration": None}


def test_a_handoff_says_where_its_streams_go() -> None:
    said = _summary("drain", {**STATUS, "draining": True, "handed_off": 3})
    assert "handed off 3 streams" in said and "another daemon" in said


def test_status_names_chunk_encoder_and_estimate() -> None:
    said = _summary("status", STATUS)
    assert "admitting 64; real-time estimate 246" in said and "1120 ms chunks" in said
    assert "encoder eager (attention: explicit), decoder eager" in said


def test_status_says_a_stalled_engine_needs_a_restart() -> None:
    assert "STALLED" not in _summary("status", STATUS)
    said = _summary("status", {**STATUS, "stalled": True})
    assert "ENGINE STALLED" in said and "restart the daemon" in said


def test_a_migration_says_what_clients_noticed_and_what_it_cost() -> None:
    report = {"ok": True, "moved": True, "source": "cuda:0 bf16", "target": "cuda:0 fp16", "pause_ms": 10.83,
              "serving_gap_ms": 44.5, "prepare_ms": 112000.0, "graphs": "encoder 60, decoder 35",
              "graphs_deferred": 0, "streams_failed": 0, "error": ""}
    said = _summary("migrate", {**STATUS, "migration": report})
    assert said.endswith("migration cuda:0 bf16 -> cuda:0 fp16: ok, paused 10.8 ms, serving gap 44 ms; prepared in "
                         "112.0 s (encoder 60, decoder 35 graphs captured)"), said
    deferred = _summary("status", {**STATUS, "last_migration": {**report, "serving_gap_ms": None, "graphs_deferred": 93,
                                                                "streams_failed": 2}})
    assert "paused 10.8 ms; prepared" in deferred and "93 batch sizes left to their first step" in deferred
    assert deferred.endswith("; 2 streams ended by failed steps")
    same = _summary("migrate", {**STATUS, "migration": {**report, "moved": False}})
    assert same.endswith("cuda:0 fp16: already there, nothing done")


def test_version_and_a_right_context_the_model_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("streamd ")
    from streamd.model.dims import ModelDims
    with pytest.raises(ValueError, match=r"right context 7 is not one this model was trained for; use 13, 6, 1 or 0"):
        ModelDims(vocab_size=8).att_context_with_right(7)


def test_a_failed_migration_names_what_was_asked() -> None:
    """`admin migrate --device cuda` on a machine without CUDA: `cpu fp32 -> cuda`, not `cuda None`."""
    import asyncio
    import dataclasses

    from daemon import config, running

    async def main() -> list[str]:
        async with running(config()) as (app, _):
            reports = [await app.control.migrate("cuda", None), await app.control.migrate(None, "fp8")]
            return [_summary("migrate", {**STATUS, "migration": dataclasses.asdict(r)}) for r in reports]

    cuda, fp8 = asyncio.run(main())
    assert "migration cpu fp32 -> cuda: " in cuda and "CUDA is not available" in cuda and "None" not in cuda, cuda
    assert "migration cpu fp32 -> fp8: " in fp8 and "unknown dtype 'fp8'" in fp8 and "None" not in fp8, fp8


def test_serve_help_shows_choices_and_the_log_names_the_page_and_a_clean_exit(
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    import asyncio
    import logging

    from daemon import config, running

    with pytest.raises(SystemExit) as done:
        cli.main(["serve", "-h"])
    said = " ".join(capsys.readouterr().out.split())
    assert done.value.code == 0
    for flag in ("--dtype {fp32,bf16,fp16}", "--backlog-policy {pace,close}", "--admission {capacity,max_streams}",
                 "--cuda-graphs {on,off}", "--gate-mode {on,off}"):
        assert flag in said, flag

    async def main() -> str:
        async with running(config()) as (_, url):
            return url.replace("ws://", "http://") + "/"

    caplog.set_level(logging.INFO, logger="streamd")
    page = asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("serving ") and line.endswith(f"browser page {page}") for line in lines), lines
    assert lines[-1] == "stopped", lines[-3:]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_port_taken_while_the_model_loaded_is_one_clear_error_too(workers: int) -> None:
    """The check before the model loads found the port free; another program took it before the
    listener (or the front ends' shared socket) bound it: the same words, not an errno."""
    sys.path.insert(0, str(Path(__file__).parent / "server"))
    from daemon import config

    async def main() -> None:
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            with pytest.raises(ConfigError) as exc:
                await asyncio.wait_for(App(build_state(config(port=port, workers=workers), Metrics(process=False))).serve(),
                                       120)
        assert str(exc.value) == (f"port {port} on 127.0.0.1 is already in use (taken while the model loaded) "
                                  "(another streamd or another program listens there); stop it or choose another "
                                  "with --port")

    asyncio.run(main())


def test_a_port_the_front_ends_served_is_free_again_once_they_stopped() -> None:
    """Connections the front ends closed wait out TIME_WAIT on the port after the daemon stops;
    the next start's check must not call it in use (a restart refused for a minute), while a
    live front end's listener still is."""
    from streamd.server.link import listening_socket
    from streamd.server.ports import check_free

    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    front = listening_socket("127.0.0.1", port)
    client = socket.create_connection(("127.0.0.1", port))
    front.setblocking(True)
    served, _ = front.accept()
    with pytest.raises(ConfigError, match="already in use"):
        check_free("127.0.0.1", port, "--port")  # a front end listens
    served.close()  # the daemon closes first: its side of the connection waits in TIME_WAIT
    client.recv(1)
    client.close()
    front.close()
    check_free("127.0.0.1", port, "--port")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_urls_the_serving_line_prints_work(host: str, caplog: pytest.LogCaptureFixture) -> None:
    """A user copies the stream URL and the page's address from the log: with an IPv6 host too
    (in brackets: ws://[::1]:PORT, not ws://::1:PORT)."""
    import asyncio
    import logging
    import re
    import urllib.request

    from daemon import config, running
    from websockets.asyncio.client import connect

    if host == "::1":
        try:
            with socket.socket(socket.AF_INET6) as probe:
                probe.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback on this machine")
    caplog.set_level(logging.INFO, logger="streamd")

    async def main() -> tuple[str, bytes, str]:
        async with running(config(host=host)):
            line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("serving "))
            stream, page = re.search(r" on (\S+) \(.*browser page (\S+)$", line).groups()  # type: ignore[union-attr]
            async with connect(stream) as ws:
                await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"}))
                ready = json.loads(await ws.recv())["type"]
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(page, timeout=10).read())
            return stream, body, ready

    stream, body, ready = asyncio.run(main())
    assert stream.startswith("ws://[::1]:" if host == "::1" else "ws://127.0.0.1:") and stream.endswith("/v1/stream")
    assert ready == "ready" and b"<html" in body.lower()
