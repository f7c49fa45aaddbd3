"""`finalize` with every stream slot taken: the stream's next segment waits for the slot of the
segment it closed, instead of failing with `overloaded` (issue: finalize opened a second slot
before freeing the first)."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import websockets

from daemon import config, running

START = json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"})


async def finalizing_client(url: str, seed: int) -> list[dict[str, object]]:
    pcm = np.random.default_rng(seed).normal(0, 3000, 16000 * 4).astype("<i2").tobytes()
    async with websockets.connect(url + "/v1/stream") as ws:
        await ws.send(START)
        for part in (pcm[: len(pcm) // 2], pcm[len(pcm) // 2:]):
            for i in range(0, len(part), 6400):
                await ws.send(part[i: i + 6400])
            await ws.send(json.dumps({"type": "finalize"}))
        await ws.send(json.dumps({"type": "stop"}))
        return [json.loads(m) async for m in ws]


def test_finalize_works_with_the_daemon_full() -> None:
    async def main() -> None:
        async with running(config(max_streams=2)) as (app, url):
            results = await asyncio.gather(*(finalizing_client(url, s) for s in range(2)))
            for messages in results:
                assert not [m for m in messages if m["type"] == "error"], messages[-1]
                assert messages[-1]["type"] == "summary"
                reasons = [m["reason"] for m in messages if m["type"] == "final"]
                assert reasons.count("finalize") == 2, reasons
            assert app.state.engine.recognizer.active == 0

    asyncio.run(main())
