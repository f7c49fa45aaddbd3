"""The front-end channel's messages: typed, frozen, and the same after crossing the channel."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from streamd.config import Config
from streamd.engine.types import ChunkGeometry, ChunkResult, EngineStatus, StepResults
from streamd.server import link
from streamd.server.channel import BlockingEnd, socket_pair

STATUS = EngineStatus("cpu", "fp32", ChunkGeometry(13, 8, 160, 16000), capacity=4)
AUDIO = link.StreamAudio([3, 1, 3], [2, 0, 3], np.arange(5, dtype=np.float32))
RESULTS = link.Results(np.array([3, 1]), StepResults(np.array([[5, 6], [7, 0]]), np.array([[0, 1], [3, 0]]),
                                                     np.array([2, 0]), np.array([0, 2]), np.array([2, 4])))
EVERY = [
    link.OpenStream(3), link.SharedAudio([3, 1], [2, 5], 128, 256), AUDIO, link.EndStream(3), link.CloseStream(1), link.FrontMetrics([]),
    link.MetricsRequest(7), link.Up(1234), link.NeedRoom(),
    link.Opened(3, None), link.Opened(4, "all 4 stream slots are in use"),
    RESULTS, link.Done(3), link.Failed(1, "engine step failed"),
    link.MetricsText(7, b"# metrics\n"), link.Status(STATUS, True, (10, None)), link.Reconfigure(Config()),
    link.Evict(), link.Handoff(), link.Shutdown(),
]


def crossed(messages: list[object]) -> list[object]:
    """`messages` sent through a channel and read back."""
    a, b = socket_pair()
    sender, receiver = BlockingEnd(a), BlockingEnd(b)
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(receiver.recv()))
    reader.start()
    sender.send(messages)
    reader.join(10)
    sender.close()
    receiver.close()
    return got[0]  # type: ignore[return-value]


def test_every_message_crosses_the_channel_unchanged() -> None:
    got = crossed(EVERY)
    assert [type(m) for m in got] == [type(m) for m in EVERY]
    for sent, back in zip(EVERY, got):
        if isinstance(sent, link.StreamAudio):
            assert isinstance(back, link.StreamAudio)
            assert (back.stream_ids, back.sizes) == (sent.stream_ids, sent.sizes)
            np.testing.assert_array_equal(back.samples, sent.samples)
        elif isinstance(sent, link.Results):
            assert isinstance(back, link.Results) and back.items() == sent.items()
        else:
            assert back == sent


def test_the_two_directions_are_told_apart_by_type() -> None:
    """Each message goes one way: the two unions share no class."""
    to_engine, to_front = set(link.ToEngine.__args__), set(link.ToFront.__args__)
    assert not to_engine & to_front
    assert {type(m) for m in EVERY} == to_engine | to_front


@pytest.mark.parametrize("message", EVERY, ids=lambda m: type(m).__name__)
def test_messages_are_frozen(message: object) -> None:
    for f in dataclasses.fields(message) or [None]:  # type: ignore[arg-type]
        with pytest.raises((dataclasses.FrozenInstanceError, AttributeError, TypeError)):
            setattr(message, f.name if f is not None else "anything", None)


def test_results_give_each_stream_its_chunk_result() -> None:
    assert RESULTS.items() == [(3, ChunkResult([5, 6], [0, 1], 0, 2)), (1, ChunkResult([], [], 2, 4))]
