"""`streamd listen` against a real audio device: PortAudio -> ALSA pulse plugin -> a PulseAudio
null sink's monitor, into which the test plays a WAV with `paplay`.

The client runs as a subprocess (the real CLI, real signals); the daemon runs in this process.
PulseAudio resamples the 16 kHz WAV to the device rate the client opens and the daemon resamples
it back, so the expected transcript is the one the received audio gives (see client_support).
"""
from __future__ import annotations

import asyncio
import dataclasses
import io
import re
import signal
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from client_support import PushRecorder, best_correlation, replay_finals, speech
from conftest import REPO
from daemon import config, running
from pulse_sink import null_sink, play
from streamd.clients import mic
from streamd.clients.mic import MicrophoneError, capture_rate
from streamd.config import EndpointingConfig

FINAL_LINE = re.compile(r"^\[(\d\d):(\d\d\.\d{3}) --> (\d\d):(\d\d\.\d{3})\] (.+)$")


class Output:
    """A subprocess's stdout and stderr lines, collected as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.out: list[str] = []
        self.err: list[str] = []
        assert proc.stdout is not None and proc.stderr is not None
        self._pumps = [asyncio.create_task(self._pump(proc.stdout, self.out)),
                       asyncio.create_task(self._pump(proc.stderr, self.err))]

    @staticmethod
    async def _pump(stream: asyncio.StreamReader, lines: list[str]) -> None:
        async for line in stream:
            lines.append(line.decode().rstrip("\n"))

    async def wait(self, predicate: Callable[[], bool], timeout: float) -> None:
        async def poll() -> None:
            while not predicate():
                await asyncio.sleep(0.05)
        try:
            await asyncio.wait_for(poll(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"timed out; stdout={self.out} stderr={self.status}") from None

    async def finish(self) -> None:
        await asyncio.gather(*self._pumps)

    @property
    def status(self) -> list[str]:
        """stderr without `-X importtime`'s lines."""
        return [line for line in self.err if not line.startswith("import time:")]

    def count(self, text: str) -> int:
        return sum(text in line for line in self.status)


async def listen(url: str, env: dict[str, str]) -> tuple[asyncio.subprocess.Process, Output]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-X", "importtime", "-m", "streamd", "listen", "--url", url, "--device", "pulse",
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return proc, Output(proc)


async def interrupt(proc: asyncio.subprocess.Process, output: Output) -> int:
    """Ctrl-C: the client sends stop, prints the last finals and exits."""
    proc.send_signal(signal.SIGINT)
    code = await asyncio.wait_for(proc.wait(), 60)
    await output.finish()
    return code


def write_speech(path: Path, passes: int) -> None:
    sf.write(path, np.tile(speech(pad_s=0.5), passes), 16000, subtype="PCM_16")


def cut_often() -> EndpointingConfig:
    """Endpoints every 2 s, whatever the fixture model makes of silence."""
    return EndpointingConfig(max_utterance_ms=2000)


def test_listen_shows_the_finals_of_what_the_microphone_hears_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    wav = tmp_path / "speech.wav"
    write_speech(wav, passes=2)
    mid_second_pass = round(1.5 * len(speech(pad_s=0.5)))  # 16 kHz samples the daemon has when Ctrl-C comes
    with null_sink(tmp_path) as env:
        devices = subprocess.run([sys.executable, "-m", "streamd", "listen", "--list-devices"], cwd=REPO, env=env,
                                 capture_output=True, text=True, check=True).stdout
        assert re.search(r"^[ *]\s+\d+\s+pulse\s", devices, re.M), devices

        async def main() -> None:
            async with running(dataclasses.replace(config(), endpointing=cut_often())) as (app, url):
                received = PushRecorder(app)
                proc, output = await listen(url, env)
                await output.wait(lambda: output.count("listening to 'pulse'") == 1, 30)
                player = asyncio.create_task(play(wav, env))
                # Ctrl-C by the audio the daemon got, not by time or printed lines: on a slow machine
                # those can lag until the speech has ended and nothing is left for the stop to flush
                await output.wait(lambda: received.samples() >= mid_second_pass, 30)
                assert await interrupt(proc, output) == 0, output.status
                await player
                audio = received.stop()
                expected = await replay_finals(url, audio)

            assert best_correlation(audio, speech(pad_s=0.0)) > 0.9, "the daemon did not get the played WAV"
            printed = [FINAL_LINE.match(line) for line in output.out]
            assert all(printed), output.out
            assert len(printed) >= 2, output.out  # finals while listening (cut every 2 s) and the stop's
            assert [m[5] for m in printed if m] == [f.text for f in expected]
            times = [(60 * int(m[1]) + float(m[2]), 60 * int(m[3]) + float(m[4])) for m in printed if m]
            for i, ((start, end), final) in enumerate(zip(times, expected)):
                # the stop's final may end at the audio's last sample live and at the 2-s cut's
                # frame in the replay (CI: 6.681 against 6.7 s): within one encoder frame
                tolerance = 0.08 if i == len(expected) - 1 else 0.002
                assert abs((end - start) - (final.end - final.start)) < tolerance, (start, end, final)
            assert [s for s, _ in times] == sorted(s for s, _ in times)
            # the stop flushed the speech pending at Ctrl-C, and the client printed it (its reason is
            # max_utterance when the 2-s cut falls on the last frame)
            assert expected[-1].reason in ("end_of_stream", "max_utterance")
            assert abs(expected[-1].end - len(audio) / 16000) < 0.1, (expected[-1], len(audio))
            assert output.count("stopped:") == 1
            assert not [line for line in output.err if line.startswith("import time:") and "torch" in line]

        asyncio.run(main())


def test_listen_reconnects_when_the_daemon_restarts(tmp_path: Path) -> None:
    wav = tmp_path / "speech.wav"
    write_speech(wav, passes=1)
    with null_sink(tmp_path) as env:
        async def main() -> None:
            async with running(config()) as (_, url):
                port = int(url.rsplit(":", 1)[1])
                proc, output = await listen(url, env)
                await output.wait(lambda: output.count("listening to") == 1, 30)
            # the daemon drained the stream and is gone: the client retries with backoff, and says
            # what to start
            await output.wait(lambda: output.count("reconnecting in") >= 2, 30)
            assert output.count("connection refused: is `streamd serve` running there?") >= 1, output.status
            restarted = dataclasses.replace(config(port=port), endpointing=cut_often())
            async with running(restarted) as (app, url):
                received = PushRecorder(app)
                # a new session: the audio captured since listening began is replayed, none dropped
                await output.wait(lambda: output.count("new session") == 1, 60)
                await play(wav, env)
                await output.wait(lambda: len(output.out) >= 1, 30)
                assert await interrupt(proc, output) == 0, output.status
                audio = received.stop()
            assert output.count("the daemon shut down") == 1
            assert output.count("listening to") == 1
            assert best_correlation(audio, speech(pad_s=0.0)) > 0.9

        asyncio.run(main())


def test_capture_rate_is_the_native_rate_within_the_protocol_limits() -> None:
    assert capture_rate({"default_samplerate": 44100.0}, None) == 44100
    assert capture_rate({"default_samplerate": 96000.0}, None) == 48000
    assert capture_rate({"default_samplerate": 48000.0}, 16000) == 16000
    with pytest.raises(MicrophoneError):
        capture_rate({"default_samplerate": 48000.0}, 96000)


def test_list_devices_says_when_there_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.SimpleNamespace(default=types.SimpleNamespace(device=(-1, -1)),
                                 query_hostapis=lambda: [{"name": "ALSA"}],
                                 query_devices=lambda: [{"index": 0, "name": "HDMI out", "hostapi": 0,
                                                         "max_input_channels": 0, "default_samplerate": 48000.0}])
    monkeypatch.setattr(mic, "_sounddevice", lambda: fake)
    out = io.StringIO()
    mic.print_devices(out)
    assert out.getvalue().startswith("no input devices found")
