"""(benchmarks/cpu-2026-12-07l-convoy; run: python convoy.py LOAD threads|loop)
Does a busy event loop starve a front end's channel threads (the GIL's convoy effect)?
The loop runs callbacks of BUSY_US of Python work to LOAD of its time; every 4 ms it queues a
message for a writer thread (blocking sendall), and a reader thread receives messages a peer
process sends every 12 ms (as results come), handing each to the loop. Reports per message the
delay from queueing to sent, and from the peer's send to the loop's dispatch."""
import asyncio, os, pickle, queue, socket, struct, sys, threading, time, multiprocessing as mp

LOAD = float(sys.argv[1]) if len(sys.argv) > 1 else 0.7
MODE = sys.argv[2] if len(sys.argv) > 2 else "threads"
SECONDS = 6.0
H = struct.Struct("!Qd")

def peer(sock):
    # reads our messages; sends 'results' every 12 ms with its send time
    sock.setblocking(True)
    stop = time.time() + SECONDS + 1
    def reader():
        while True:
            try:
                if not sock.recv(1 << 20): return
            except OSError: return
    threading.Thread(target=reader, daemon=True).start()
    body = pickle.dumps(list(range(2000)))
    while time.time() < stop:
        sock.sendall(H.pack(len(body), time.time()) + body)
        time.sleep(0.012)
    sock.close()

def busy(us):
    t = time.perf_counter() + us / 1e6
    x = 0
    while time.perf_counter() < t:
        x += 1

async def main(sock):
    loop = asyncio.get_running_loop()
    out = queue.SimpleQueue()
    sent, got = [], []
    payload = pickle.dumps([list(range(300)), list(range(300)), 5, 6])
    def writer():
        while (item := out.get()) is not None:
            t, data = item
            try:
                sock.sendall(H.pack(len(data), t) + data)
            except OSError:  # the run ended (the socket closed) with messages still queued
                return
            sent.append(time.perf_counter() - t)
    def exactly(n):
        buf = bytearray(n); v = memoryview(buf); k = 0
        while k < n:
            r = sock.recv_into(v[k:])
            if not r: raise EOFError
            k += r
        return buf
    def reader():
        while True:
            try:
                n, t = H.unpack(exactly(H.size)); body = exactly(n)
            except (EOFError, OSError): return
            try:
                loop.call_soon_threadsafe(lambda t=t, b=body: got.append(time.time() - t))
            except RuntimeError:  # the run ended (the loop closed) with messages still coming
                return
    if MODE == "threads":
        sock.setblocking(True)
        threading.Thread(target=writer, daemon=True).start()
        threading.Thread(target=reader, daemon=True).start()
        def send(data): out.put((time.perf_counter(), data))
    else:  # the loop's own non-blocking socket
        sock.setblocking(False)
        pending = bytearray(); rbuf = bytearray()
        def on_write():
            nonlocal pending
            try: k = sock.send(pending)
            except BlockingIOError: return
            del pending[:k]
            if not pending: loop.remove_writer(sock)
        def send(data):
            t = time.perf_counter()
            was = bool(pending)
            pending.extend(H.pack(len(data), t) + data)
            if not was: on_write()
            if pending: loop.add_writer(sock, on_write)
            sent.append(time.perf_counter() - t)  # handed to the kernel now or queued
        def on_read():
            try: chunk = sock.recv(1 << 20)
            except BlockingIOError: return
            rbuf.extend(chunk)
            while len(rbuf) >= H.size:
                n, t = H.unpack_from(rbuf)
                if len(rbuf) < H.size + n: break
                pickle.loads(rbuf[H.size:H.size + n]); del rbuf[:H.size + n]
                got.append(time.time() - t)
        loop.add_reader(sock, on_read)
    end = time.time() + SECONDS
    work = 0
    async def flusher():
        while time.time() < end:
            await asyncio.sleep(0.004)
            send(payload)
    f = asyncio.create_task(flusher())
    while time.time() < end:  # busy LOAD of each 10 ms, in 200-us pieces between which I/O runs
        w0 = time.perf_counter()
        while time.perf_counter() - w0 < LOAD * 0.010:
            busy(200); work += 1
            await asyncio.sleep(0)
        left = 0.010 - (time.perf_counter() - w0)
        if left > 0:
            await asyncio.sleep(left)
    await f
    if MODE == "threads": out.put(None)
    import statistics as st
    q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))] if xs else float("nan")
    print(f"{MODE:8s} load {LOAD:.2f}: loop work {work * 200e-6 / SECONDS:.2f} of the time; "
          f"sent {len(sent)} (delay p50 {1e3*q(sent,.5):.2f} p95 {1e3*q(sent,.95):.2f} max {1e3*max(sent):.1f} ms); "
          f"received {len(got)} (delay p50 {1e3*q(got,.5):.2f} p95 {1e3*q(got,.95):.2f} max {1e3*max(got):.1f} ms)")

if __name__ == "__main__":
    a, b = socket.socketpair()
    p = mp.get_context("fork").Process(target=peer, args=(b,)); p.start(); b.close()
    asyncio.run(main(a))
    a.close(); p.join(5)
