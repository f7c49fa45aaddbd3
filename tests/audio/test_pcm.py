"""PCM intake: decoding, byte carry across frames, downmix, clipping, resampling."""
from __future__ import annotations

import numpy as np
import pytest
import soxr  # type: ignore[import-untyped]

from streamd.audio.pcm import PcmDecoder
from streamd.protocol import check_format
from streamd.errors import UnsupportedAudio

MODEL_RATE = 16_000  # the fixture models' rate


def feed_in_pieces(dec: PcmDecoder, data: bytes, rng: np.random.Generator, max_piece: int = 997
                   ) -> np.ndarray:
    out, i = [], 0
    while i < len(data):
        n = int(rng.integers(0, max_piece))  # zero-length frames included
        out.append(dec.feed(data[i:i + n]))
        i += n
    out.append(dec.flush())
    assert all(chunk.dtype == np.float32 for chunk in out)
    return np.concatenate(out)


def noise(rng: np.random.Generator, frames: int, channels: int = 1) -> np.ndarray:
    return (rng.uniform(-0.9, 0.9, size=(frames, channels))).astype(np.float32)


def test_s16le_scaling() -> None:
    pcm = np.array([-32768, -16384, 0, 16384, 32767], dtype="<i2").tobytes()
    out = PcmDecoder(16000, "s16le", model_rate=MODEL_RATE).feed(pcm)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [-1.0, -0.5, 0.0, 0.5, 32767 / 32768])


def test_f32le_is_passed_through_and_clipped() -> None:
    values = np.array([0.25, -0.75, 1.5, -2.0, 1.0], dtype="<f4")
    out = PcmDecoder(16000, "f32le", model_rate=MODEL_RATE).feed(values.tobytes())
    np.testing.assert_array_equal(out, [0.25, -0.75, 1.0, -1.0, 1.0])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_f32le_rejects_nan_and_inf(bad: float) -> None:
    dec = PcmDecoder(16000, "f32le", channels=2, model_rate=MODEL_RATE)
    dec.feed(np.zeros(6, dtype="<f4").tobytes())  # 3 frames
    values = np.array([0.0, 0.0, 0.0, bad], dtype="<f4")
    with pytest.raises(UnsupportedAudio, match="NaN or infinite sample at frame 4"):
        dec.feed(values.tobytes())


def test_odd_bytes_are_carried_to_the_next_frame() -> None:
    pcm = np.array([1000, -2000, 3000], dtype="<i2").tobytes()
    dec = PcmDecoder(16000, "s16le", model_rate=MODEL_RATE)
    assert dec.feed(pcm[:1]).size == 0
    assert dec.pending_bytes == 1
    np.testing.assert_array_equal(dec.feed(pcm[1:4]), np.array([1000, -2000], np.float32) / 32768)
    assert dec.pending_bytes == 0
    assert dec.feed(pcm[4:5]).size == 0
    np.testing.assert_array_equal(dec.feed(pcm[5:]), np.array([3000], np.float32) / 32768)
    assert dec.frames_received == 3


def test_f32_carries_up_to_three_bytes() -> None:
    data = np.array([0.5, -0.25], dtype="<f4").tobytes()
    dec = PcmDecoder(16000, "f32le", model_rate=MODEL_RATE)
    for i in range(3):
        assert dec.feed(data[i:i + 1]).size == 0
        assert dec.pending_bytes == i + 1
    np.testing.assert_array_equal(dec.feed(data[3:]), [0.5, -0.25])


@pytest.mark.parametrize("encoding", ["s16le", "f32le"])
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_any_split_gives_the_same_samples_at_16k(encoding: str, channels: int) -> None:
    rng = np.random.default_rng(channels)
    audio = noise(rng, 16000, channels)
    data = (audio * 32767).astype("<i2").tobytes() if encoding == "s16le" else audio.astype(
        "<f4").tobytes()
    whole = PcmDecoder(16000, encoding, channels, model_rate=MODEL_RATE).feed(data)
    assert whole.shape == (16000,)
    for seed in range(5):
        pieces = feed_in_pieces(PcmDecoder(16000, encoding, channels, model_rate=MODEL_RATE), data,
                                np.random.default_rng(seed))
        np.testing.assert_array_equal(pieces, whole)


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 44100, 48000])
@pytest.mark.parametrize("encoding", ["s16le", "f32le"])
def test_resampled_stream_matches_one_shot_soxr(rate: int, encoding: str) -> None:
    rng = np.random.default_rng(rate)
    audio = noise(rng, rate * 2)[:, 0]
    if encoding == "s16le":
        ints = (audio * 32767).astype("<i2")
        data, reference_in = ints.tobytes(), ints.astype(np.float32) / 32768
    else:
        data, reference_in = audio.astype("<f4").tobytes(), audio
    stream = soxr.ResampleStream(rate, MODEL_RATE, 1, dtype="float32", quality="HQ")
    expected = np.concatenate([stream.resample_chunk(reference_in),
                               stream.resample_chunk(np.zeros(0, np.float32), last=True)])
    got = feed_in_pieces(PcmDecoder(rate, encoding, model_rate=MODEL_RATE), data, np.random.default_rng(1))
    np.testing.assert_array_equal(got, expected)
    assert len(got) == 2 * MODEL_RATE


def test_channels_are_averaged() -> None:
    frames = np.array([[0.5, -0.5], [0.25, 0.25], [1.0, 0.0]], dtype="<f4")
    out = PcmDecoder(16000, "f32le", channels=2, model_rate=MODEL_RATE).feed(frames.tobytes())
    np.testing.assert_array_equal(out, [0.0, 0.25, 0.5])


def test_partial_multichannel_frame_is_carried() -> None:
    frames = np.array([[1000, 3000], [-1000, -3000]], dtype="<i2").tobytes()
    dec = PcmDecoder(16000, "s16le", channels=2, model_rate=MODEL_RATE)
    assert dec.feed(frames[:6]).size == 1
    assert dec.pending_bytes == 2
    np.testing.assert_array_equal(dec.feed(frames[6:]), np.array([-2000], np.float32) / 32768)


def test_received_time_counts_input_frames() -> None:
    dec = PcmDecoder(8000, "s16le", channels=2, model_rate=MODEL_RATE)
    dec.feed(b"\0" * (8000 * 2 * 2 + 3))
    assert dec.frames_received == 8000
    assert dec.seconds_received == 1.0


def test_flush_ends_the_stream() -> None:
    dec = PcmDecoder(16000, "s16le", model_rate=MODEL_RATE)
    dec.feed(b"\0\0\0")
    assert dec.flush().size == 0  # the odd byte is dropped
    assert dec.pending_bytes == 0
    with pytest.raises(RuntimeError, match="after flush"):
        dec.feed(b"\0\0")
    with pytest.raises(RuntimeError, match="twice"):
        dec.flush()


@pytest.mark.parametrize(("rate", "encoding", "channels", "message"), [
    (7999, "s16le", 1, "unsupported sample_rate 7999; use 8000..48000 Hz"),
    (48001, "s16le", 1, "unsupported sample_rate 48001"),
    (16000, "mulaw", 1, 'unsupported encoding "mulaw"; use one of s16le, f32le'),
    (16000, "s16le", 0, "unsupported channels 0; use 1..8"),
    (16000, "f32le", 9, "unsupported channels 9"),
])
def test_unsupported_formats(rate: int, encoding: str, channels: int, message: str) -> None:
    with pytest.raises(UnsupportedAudio, match=message):
        check_format(rate, encoding, channels)
    with pytest.raises(UnsupportedAudio):
        PcmDecoder(rate, encoding, channels, model_rate=MODEL_RATE)
