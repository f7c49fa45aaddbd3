"""CPU a sent message over a local websocket (server and client in this process), three ways: the
bare `ws.send`; inside `asyncio.timeout` (streamd's send before); and streamd's `Connection.send_text`
check first (`can_send_at_once`: open, write buffer under the high-water mark with the frame in it)
taking the bare send when it holds. 200 connections, 100 messages of ~300 bytes each, 5 runs.

    python send_micro.py TREE
"""
import asyncio
import statistics
import sys
import time

sys.path.insert(0, sys.argv[1])
from websockets.asyncio.client import connect  # noqa: E402
from websockets.asyncio.server import serve  # noqa: E402

try:
    from streamd.server.handler import can_send_at_once  # noqa: E402
except ImportError:
    can_send_at_once = None
TEXT = '{"type":"partial","text":"' + "word " * 50 + '"}'
N_CONN, N_MSG = 200, 100


async def run(mode: str) -> float:
    ready = asyncio.Event()
    conns = []

    async def handler(ws):
        conns.append(ws)
        if len(conns) == N_CONN:
            ready.set()
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        clients = [await connect(f"ws://127.0.0.1:{port}", compression=None) for _ in range(N_CONN)]
        await ready.wait()

        async def drain(c):
            for _ in range(N_MSG):
                await c.recv()
        readers = [asyncio.create_task(drain(c)) for c in clients]
        t = time.process_time()
        for _ in range(N_MSG):
            for ws in conns:
                if mode == "bare" or (mode == "checked" and can_send_at_once(ws, TEXT)):
                    await ws.send(TEXT)
                else:
                    async with asyncio.timeout(5):
                        await ws.send(TEXT)
            await asyncio.sleep(0)
        sent = time.process_time() - t
        await asyncio.gather(*readers)
        for c in clients:
            await c.close()
    return sent / (N_CONN * N_MSG) * 1e6


modes = ["bare", "timeout"] + (["checked"] if can_send_at_once else [])
results = {m: [] for m in modes}
for rep in range(5):
    for m in modes:
        results[m].append(asyncio.run(run(m)))
for m in modes:
    print(f"{m}: {statistics.median(results[m]):.1f} us a send (median of 5; runs {', '.join(f'{v:.1f}' for v in results[m])})")
