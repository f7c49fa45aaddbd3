"""Why a connection ended, as the access log says it: a client that closes normally, a stream
handed off to another daemon and a client that vanished are told apart (Realtime sessions
included); the line names the path and the client's address."""
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
            async with websockets.connect(url + "/v1/stream?token=hidden") as bad:  # ended by an error
                await bad.send("{not json")
                with pytest.raises(websockets.ConnectionClosed):
                    while True:
                        await bad.recv()
            await asyncio.sleep(0.5)

    with caplog.at_level(logging.INFO, logger="streamd.access"):
        asyncio.run(main())
    ends = [r for r in caplog.records if r.name == "streamd.access"]
    assert [r.getMessage().split(" ")[0] for r in ends] == ["disconnect"] * 3, ends
    reasons = [r.getMessage().split("(")[1].split(")")[0] for r in ends]
    assert reasons == ["client closed", "handed off", "protocol_violation"], reasons
    assert [(vars(r)["path"], vars(r)["remote"].startswith("127.0.0.1:")) for r in ends] == [
        ("/v1/realtime", True), ("/v1/stream", True), ("/v1/stream", True)]  # never the query's token
