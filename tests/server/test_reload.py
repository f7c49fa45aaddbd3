"""`systemctl reload` (SIGHUP to the real daemon process): the configuration file is read again;
what can change live changes, what cannot is logged as needing a restart, a broken file changes
nothing, and the process never ends."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import websockets

from conftest import REPO
from daemon import TINY, Transcript, read_all

SERVING = re.compile(r"serving .* on ws://([\d.]+):(\d+)/v1/stream")
START = json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"})


def write_config(path: Path, idle_timeout_s: float, port: int = 0, extra: str = "") -> None:
    path.write_text(f"[server]\nport = {port}\nidle_timeout_s = {idle_timeout_s}\n{extra}"
                    f"[engine]\nmodel = \"{TINY}\"\ndevice = \"cpu\"\n[admin]\nsocket = \"\"\n")


async def idle_close_s(url: str) -> tuple[float, Transcript]:
    """Seconds until the daemon closes a stream that sends `start` and then nothing."""
    async with websockets.connect(url + "/v1/stream") as ws:
        await ws.send(START)
        t0 = time.monotonic()
        out = await asyncio.wait_for(read_all(ws, Transcript()), 20)
        return time.monotonic() - t0, out


@pytest.mark.parametrize("workers", [0, 1], ids=["one-process", "front-end-process"])
def test_sighup_rereads_the_config_and_never_ends_the_daemon(tmp_path: Path, workers: int) -> None:
    conf = tmp_path / "streamd.toml"
    workers_line = f"workers = {workers}\n"
    write_config(conf, idle_timeout_s=30, extra=workers_line)

    async def main() -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamd", "serve", "--config", str(conf), cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        log: list[str] = []
        bound: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def read_log() -> None:
            assert proc.stderr is not None
            async for raw in proc.stderr:
                log.append(raw.decode(errors="replace").rstrip())
                if (m := SERVING.search(log[-1])) and not bound.done():
                    bound.set_result(f"ws://{m[1]}:{m[2]}")
            if not bound.done():
                bound.set_exception(RuntimeError("the daemon exited before serving:\n" + "\n".join(log)))

        async def logged(text: str) -> str:
            deadline = time.monotonic() + 10
            while not any(text in line for line in log):
                assert proc.returncode is None, "\n".join(log)
                assert time.monotonic() < deadline, f"no {text!r} in the log:\n" + "\n".join(log)
                await asyncio.sleep(0.05)
            return next(line for line in log if text in line)

        reader = asyncio.create_task(read_log())
        try:
            url = await asyncio.wait_for(bound, 120)
            port = int(url.rsplit(":", 1)[1])
            live = await websockets.connect(url + "/v1/stream")  # open across the reloads
            await live.send(START)
            async with websockets.connect(url + "/v1/realtime") as short:  # an access line as it ends
                await short.recv()
            line = await logged("INFO streamd.access: disconnect")
            assert "(client closed)" in line and "path=/v1/realtime remote=127.0.0.1:" in line, line

            # Live: idle_timeout_s 30 -> 1, the log level and the access lines. Needs a restart: the port.
            write_config(conf, idle_timeout_s=1, port=port + 1,
                         extra=workers_line + "[log]\nlevel = \"debug\"\naccess = \"off\"\n")
            proc.send_signal(signal.SIGHUP)
            line = await logged("configuration reloaded")
            assert "server.idle_timeout_s 30.0 -> 1.0" in line and "log.level info -> debug" in line, line
            assert "log.access on -> off" in line, line
            line = await logged("need a restart")
            assert f"server.port 0 -> {port + 1}" in line and "idle_timeout_s" not in line, line
            await asyncio.sleep(0.5)  # with a front-end process: the new config crosses its channel
            seconds, out = await idle_close_s(url)
            assert out.of("error")[0]["code"] == "idle_timeout" and 1 <= seconds < 4, (seconds, out.messages)
            await logged("DEBUG streamd.server: connect")  # debug lines now, and no access line
            await asyncio.sleep(0.5)
            assert sum("streamd.access" in line for line in log) == 1, "\n".join(log)

            # A broken file: an error line, nothing changes.
            conf.write_text("[server]\nidle_timeout_s = -5\n")
            proc.send_signal(signal.SIGHUP)
            line = await logged("reload failed")
            assert "server.idle_timeout_s" in line and "running configuration is kept" in line, line
            seconds, out = await idle_close_s(url)
            assert 1 <= seconds < 4, seconds

            assert proc.returncode is None, "\n".join(log)
            assert not any("Traceback" in line for line in log), "\n".join(log)
            await live.close()
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0, "\n".join(log)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await reader

    asyncio.run(main())
