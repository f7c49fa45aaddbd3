"""Why a connection ended, as the log says it: a client that closes normally, a stream handed off
to another daemon and a client that vanished are told apart (Realtime sessions included)."""
from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
import websockets

from daemon import config, running

START = json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"})


def test_the_log_says_how_a_connection_ended(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with running(config(resume_grace_s=10.0)) as (app, url):
            async with websockets.connect(url + "/v1/realtime") as ws:  # a Realtime session ends
                await ws.recv()
            handed = await websockets.connect(url + "/v1/stream")
            await handed.send(START)
            await handed.recv()
            assert app.state.hand_off() == 1
            with pytest.raises(websockets.ConnectionClosed):
                while True:
                    await handed.recv()
            await asyncio.sleep(0.5)

    with caplog.at_level(logging.INFO, logger="streamd.server"):
        asyncio.run(main())
    ends = [r.getMessage() for r in caplog.records if r.getMessage().startswith("disconnect ")]
    assert len(ends) == 2, ends
    assert "(client closed)" in ends[0] and "(handed off)" in ends[1], ends
