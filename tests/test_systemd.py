"""sd_notify against real AF_UNIX datagram sockets."""
from __future__ import annotations

import ast
import asyncio
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import streamd.systemd
from daemon import config, running
from streamd.systemd import Notifier


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    yield sock, str(path)
    sock.close()


def test_no_op_outside_systemd() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.watchdog_interval is None
    assert notifier.ready("x") is False
    assert notifier.watchdog() is False


def test_ready_with_status(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("serving 0 streams on cpu fp32") is True
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving 0 streams on cpu fp32"
    notifier.close()


def test_every_message(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.status("migrating\nto cuda:1")
    assert sock.recv(4096) == b"STATUS=migrating to cuda:1"
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.stopping("draining 3 streams")
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining 3 streams"
    assert notifier.notify("ERRNO=5", "BUSERROR=x")
    assert sock.recv(4096) == b"ERRNO=5\nBUSERROR=x"
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert notifier.reloading()
    lines = sock.recv(4096).decode().split("\n")
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert lines[0] == "RELOADING=1"
    assert lines[1].startswith("MONOTONIC_USEC=")
    assert before <= int(lines[1].split("=")[1]) <= after
    notifier.close()


def test_the_daemon_says_what_its_start_is_doing(listener: tuple[socket.socket, str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`systemctl status` of a starting daemon: its warm-up, then its step-time probe, then ready."""
    sock, path = listener
    monkeypatch.setenv("NOTIFY_SOCKET", path)

    async def main() -> int:
        async with running(config()) as (_, url):
            return int(url.rsplit(":", 1)[1])

    port = asyncio.run(main())
    said = [sock.recv(4096).decode() for _ in range(3)]
    assert said == ["STATUS=warming up on cpu fp32", "STATUS=measuring step times for the capacity estimate",
                    f"READY=1\nSTATUS=serving on port {port}"]


def test_abstract_socket() -> None:
    name = f"streamd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.ready()
        assert sock.recv(4096) == b"READY=1"
        notifier.close()


def test_send_failure_returns_false(tmp_path: Path) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert notifier.enabled
    assert notifier.ready() is False
    notifier.close()


@pytest.mark.parametrize("value", ["vsock:2:1234", "relative/path", "@"])
def test_unsupported_addresses_disable(value: str) -> None:
    assert not Notifier({"NOTIFY_SOCKET": value}).enabled


@pytest.mark.parametrize(("env", "interval"), [
    ({"WATCHDOG_USEC": "30000000"}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({}, None),
])
def test_watchdog_interval(env: dict[str, str], interval: float | None) -> None:
    assert Notifier(env).watchdog_interval == interval


def test_unset_environment() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": str(os.getpid()),
           "OTHER": "kept"}
    notifier = Notifier(env, unset_environment=True)
    assert notifier.enabled and notifier.watchdog_interval == 0.0005
    assert env == {"OTHER": "kept"}
    kept = dict(env, NOTIFY_SOCKET="/run/x")
    Notifier(kept)
    assert "NOTIFY_SOCKET" in kept


def test_imports_nothing_from_streamd_asyncio_or_torch() -> None:
    tree = ast.parse(Path(streamd.systemd.__file__).read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in modules if m.split(".")[0] in ("streamd", "asyncio", "torch")}
