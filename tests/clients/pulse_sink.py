"""A private PulseAudio server with a null sink: a real audio device for PortAudio clients.

What is played into the sink (``paplay``) comes out of its monitor source, which PortAudio
reaches through ALSA's pulse plugin (the ``pulse`` device). Works as root in a container.
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes.util
import glob
import importlib.util
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SINK = "streamd_test"
_TOOLS = ("pulseaudio", "pactl", "paplay")
_ALSA_PLUGIN = "/usr/lib/*/alsa-lib/libasound_module_pcm_pulse.so"


def _skip_without_tools() -> None:
    if importlib.util.find_spec("sounddevice") is None or ctypes.util.find_library("portaudio") is None:
        pytest.skip("needs sounddevice (pip install 'streamd[mic]') and PortAudio (apt-get install libportaudio2)")
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install pulseaudio pulseaudio-utils)")
    if not glob.glob(_ALSA_PLUGIN):
        pytest.skip("needs ALSA's pulse plugin for PortAudio (apt-get install libasound2-plugins)")


@contextlib.contextmanager
def null_sink(tmp: Path) -> Iterator[dict[str, str]]:
    """Run PulseAudio with a 16 kHz mono null sink; yield the environment for its clients."""
    _skip_without_tools()
    runtime = tmp / "pulse"
    runtime.mkdir()
    socket = runtime / "native"
    env = {**os.environ, "HOME": str(tmp), "XDG_RUNTIME_DIR": str(runtime), "PULSE_RUNTIME_PATH": str(runtime)}
    with (tmp / "pulseaudio.log").open("wb") as log:
        server = subprocess.Popen(
            ["pulseaudio", "--daemonize=no", "--system=false", "--exit-idle-time=-1", "-n", "--disallow-exit",
             "--use-pid-file=no", "--log-target=stderr",
             f"--load=module-null-sink sink_name={SINK} rate=16000 format=s16le channels=1",
             f"--load=module-native-protocol-unix socket={socket} auth-anonymous=1"],
            env=env, stdout=subprocess.DEVNULL, stderr=log)
    client_env = {**env, "PULSE_SERVER": f"unix:{socket}", "PULSE_SINK": SINK, "PULSE_SOURCE": f"{SINK}.monitor"}
    try:
        deadline = time.monotonic() + 15
        while subprocess.run(["pactl", "info"], env=client_env, capture_output=True).returncode != 0:
            assert server.poll() is None and time.monotonic() < deadline, (tmp / "pulseaudio.log").read_text()
            time.sleep(0.1)
        yield client_env
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


async def play(wav: Path, env: dict[str, str]) -> None:
    """Play ``wav`` into the sink, in real time."""
    proc = await asyncio.create_subprocess_exec("paplay", f"--device={SINK}", str(wav), env=env)
    assert await proc.wait() == 0
