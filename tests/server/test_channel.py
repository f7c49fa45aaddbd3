"""The engine <-> front-end channel: frames survive partial reads and writes in both directions."""
from __future__ import annotations

import selectors
import threading

import numpy as np

from streamd.server.channel import BlockingEnd, NonBlockingEnd, socket_pair
from streamd.server.link import CloseStream, EndStream, OpenStream, Results, StreamAudio


def test_messages_cross_in_order_whatever_their_size() -> None:
    ours, theirs = socket_pair()
    engine_end, front_end = NonBlockingEnd(ours), BlockingEnd(theirs)
    big = np.arange(3_000_000, dtype=np.float32)  # 12 MB: many partial reads and writes
    sent = [[OpenStream(1)], [StreamAudio([1], [big.size], big)], [EndStream(1), CloseStream(1)]]
    writer = threading.Thread(target=lambda: [front_end.send(m) for m in sent])
    writer.start()
    got: list = []
    with selectors.DefaultSelector() as sel:
        sel.register(engine_end, selectors.EVENT_READ)
        while len(got) < len(sent):
            sel.select(5.0)
            messages, eof = engine_end.read()
            assert not eof
            got += messages
    writer.join()
    assert got[0] == sent[0] and got[2] == sent[2]
    np.testing.assert_array_equal(got[1][0].samples, big)

    # engine -> front end: a non-blocking send larger than the socket buffer finishes by flushes
    reply = [Results([1], [(list(range(500_000)), [], 0, 1)])]
    received: list = []
    reader = threading.Thread(target=lambda: received.append(front_end.recv()))
    reader.start()
    engine_end.send(reply)
    with selectors.DefaultSelector() as sel:
        sel.register(engine_end, selectors.EVENT_WRITE)
        while engine_end.wants_write:
            sel.select(5.0)
            engine_end.flush()
    reader.join(5.0)
    assert received == [reply]


def test_a_closed_front_end_reads_as_end_of_file_and_writes_do_not_raise() -> None:
    ours, theirs = socket_pair()
    engine_end, front_end = NonBlockingEnd(ours), BlockingEnd(theirs)
    front_end.send(["last"])
    front_end.close()
    messages, eof = engine_end.read()
    assert messages == [["last"]] and eof
    engine_end.send(["nobody listens"])  # the peer is gone: marked broken, nothing raised
    assert engine_end.broken and not engine_end.wants_write
