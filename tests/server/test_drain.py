"""`streamd admin drain`, `undrain` and `drain --exit`, through the command line: a drain can be
undone (/readyz back to 200, new streams taken), status says draining instead of a limit, and
`drain --exit` ends the daemon when its last stream has ended, not before."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import websockets

from daemon import config, running
from streamd import cli
from streamd.config import AdminConfig
from test_daemon import fetch

START = json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"})


def test_a_drain_is_undone_and_drain_exit_waits_for_the_last_stream(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sock = tmp_path / "admin.sock"

    async def admin(*argv: str) -> str:
        capsys.readouterr()
        assert await asyncio.to_thread(cli.main, ["admin", "--socket", str(sock), *argv]) == 0
        return capsys.readouterr().out

    async def main() -> None:
        async with running(config(admin=AdminConfig(socket=sock))) as (app, url):
            live = await websockets.connect(url + "/v1/stream")
            await live.send(START)
            drained = await admin("drain")
            assert "draining" in drained and "admitting" not in drained, drained
            assert "undrain" in drained  # says how to undo it
            assert (await fetch(url, "/readyz"))[0] == 503
            with pytest.raises(websockets.InvalidStatus):
                await websockets.connect(url + "/v1/stream")

            undrained = await admin("undrain")
            assert "admitting 64" in undrained and "draining" not in undrained, undrained
            status, body = await fetch(url, "/readyz")
            assert status == 200 and json.loads(body)["ready"], body
            second = await websockets.connect(url + "/v1/stream")
            await second.send(START)
            await second.close()

            out = await admin("drain", "--exit")
            assert "exits when the last one ends" in out, out
            await asyncio.sleep(1.0)
            assert not app.state.shutdown.is_set()  # the live stream holds it up
            await live.send(json.dumps({"type": "stop"}))
            async for _ in live:
                pass
            await asyncio.wait_for(app.state.shutdown.wait(), 5)

    asyncio.run(main())


def test_undrain_cancels_an_exit(tmp_path: Path) -> None:
    sock = tmp_path / "admin.sock"

    async def main() -> None:
        async with running(config(admin=AdminConfig(socket=sock))) as (app, url):
            live = await websockets.connect(url + "/v1/stream")
            await live.send(START)
            app.control.drain(exit=True)
            assert app.control.status()["exit_when_drained"]
            app.control.undrain()
            await live.close()
            await asyncio.sleep(1.0)
            assert not app.state.shutdown.is_set() and not app.control.status()["draining"]

    asyncio.run(main())
