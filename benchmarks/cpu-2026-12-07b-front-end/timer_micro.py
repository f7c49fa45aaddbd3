"""CPU per message of a receive with its idle deadline: nothing, asyncio.timeout, ReceiveDeadline (1000 receivers).

    python timer_micro.py TREE
"""
import asyncio, sys, time
sys.path.insert(0, sys.argv[1])
from streamd.server.deadline import ReceiveDeadline
N, MSGS = 1000, 200

async def main(kind):
    loop = asyncio.get_running_loop()
    queues = [asyncio.Queue() for _ in range(N)]
    async def receiver(q):
        d = ReceiveDeadline()
        for _ in range(MSGS):
            if kind == "timeout":
                async with asyncio.timeout(30):
                    await q.get()
            elif kind == "deadline":
                await d.receive(q.get, loop.time() + 30)
            else:
                await q.get()
        d.close()
    tasks = [asyncio.create_task(receiver(q)) for q in queues]
    t = time.process_time()
    for m in range(MSGS):
        for q in queues:
            q.put_nowait(m)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    return (time.process_time() - t) / (N * MSGS) * 1e6

for rep in range(6):
    for kind in ("none", "timeout", "deadline"):
        print(rep, kind, f"{asyncio.run(main(kind)):.2f} us a message")
