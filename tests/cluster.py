"""Several `streamd serve` processes behind a real HAProxy (deploy/haproxy/make_config.py), on
loopback, for tests. Skips when the haproxy binary is missing."""
from __future__ import annotations

import asyncio
import contextlib
import csv
import importlib.util
import io
import os
import re
import shutil
import signal
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

from conftest import REPO
from daemon import TINY

HAPROXY = shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy", "/sbin/haproxy") if os.path.exists(p)), None)
needs_haproxy = pytest.mark.skipif(HAPROXY is None, reason="needs the haproxy binary (Debian: apt-get install haproxy)")
SERVING = re.compile(r"serving .* on ws://")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_config() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_config", REPO / "deploy" / "haproxy" / "make_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@dataclass
class Daemon:
    """One `streamd serve` child process on a fixed port, with its admin socket."""

    name: str
    port: int
    admin: Path
    extra: list[str]
    proc: asyncio.subprocess.Process | None = None
    log: list[str] = field(default_factory=list)
    _reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start it and wait until it serves (model loaded, warmed up, capacity measured)."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamd", "serve", "--config", "", "--model", str(TINY), "--device", "cpu",
            "--port", str(self.port), "--admin-socket", str(self.admin), "--gate-mode", "off", *self.extra,
            cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        serving: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        proc = self.proc

        async def read_log() -> None:
            assert proc.stderr is not None
            async for raw in proc.stderr:
                self.log.append(raw.decode(errors="replace").rstrip())
                if SERVING.search(self.log[-1]) and not serving.done():
                    serving.set_result(None)
            if not serving.done():
                serving.set_exception(RuntimeError(f"{self.name} exited:\n" + "\n".join(self.log[-20:])))

        self._reader = asyncio.create_task(read_log())
        await asyncio.wait_for(serving, 120)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
        if self.proc is not None:
            await self.proc.wait()
        if self._reader is not None:
            await self._reader

    async def get(self, path: str) -> tuple[int, str]:
        return await asyncio.to_thread(http_get, f"http://127.0.0.1:{self.port}{path}")


@dataclass
class Cluster:
    """Daemons behind one haproxy: clients use `url`."""

    daemons: list[Daemon]
    port: int
    stats_port: int
    proc: asyncio.subprocess.Process | None = None
    log: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def get(self, path: str) -> tuple[int, str]:
        return await asyncio.to_thread(http_get, f"http://127.0.0.1:{self.port}{path}")

    async def states(self) -> dict[str, str]:
        """HAProxy's view of each daemon in the stream backend: UP, DOWN, ..."""
        status, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{self.stats_port}/;csv")
        assert status == 200, body
        rows = csv.DictReader(io.StringIO(body.lstrip("# ")))
        return {r["svname"]: r["status"] for r in rows if r["pxname"] == "streamd" and r["svname"] not in
                ("FRONTEND", "BACKEND")}

    async def wait_state(self, name: str, state: str, timeout: float = 60.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        seen: dict[str, str] = {}
        while not seen.get(name, "").startswith(state):
            assert self.proc is not None and self.proc.returncode is None, "haproxy exited"
            assert asyncio.get_running_loop().time() < deadline, f"{name} not {state}: {seen}"
            await asyncio.sleep(0.1)
            try:
                seen = await self.states()
            except urllib.error.URLError:  # haproxy is still starting
                pass


@contextlib.asynccontextmanager
async def cluster(tmp: Path, extra: dict[str, list[str]]) -> AsyncIterator[Cluster]:
    """Daemons named by `extra`'s keys (each with those extra `serve` flags) behind haproxy, all UP."""
    assert HAPROXY is not None
    daemons = [Daemon(name, free_port(), tmp / f"{name}.sock", flags) for name, flags in extra.items()]
    c = Cluster(daemons, free_port(), free_port())
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(make_config().render([(d.name, f"127.0.0.1:{d.port}") for d in daemons], f"127.0.0.1:{c.port}",
                                        log="stdout", inter="300ms", fastinter="100ms", fall=1, rise=1,
                                        stats=f"127.0.0.1:{c.stats_port}"))
    try:
        await asyncio.gather(*(d.start() for d in daemons))
        c.proc = await asyncio.create_subprocess_exec(HAPROXY, "-db", "-f", str(cfg), stdin=asyncio.subprocess.DEVNULL,
                                                      stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        for d in daemons:
            await c.wait_state(d.name, "UP")
        yield c
    finally:
        try:
            if c.proc is not None:
                if c.proc.returncode is None:
                    c.proc.terminate()
                _, err = await c.proc.communicate()
                c.log = err.decode(errors="replace").splitlines()
        finally:
            await asyncio.gather(*(d.stop() for d in daemons))
