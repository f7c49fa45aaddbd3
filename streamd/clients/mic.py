"""`streamd listen`: live transcription of a microphone.

Capture is a sounddevice (PortAudio) input stream, 16-bit mono at the device's native rate.
Its callback runs on PortAudio's thread and only hands a copy of each block to the asyncio loop
(``call_soon_threadsafe``); the loop sends the blocks. The client does no resampling: it
declares the native rate in ``start`` and the daemon resamples (soxr, high quality). Devices
whose native rate is above 48 kHz, the protocol's limit, are opened at 48 kHz and PortAudio
converts.

If the connection drops (network, daemon restarted, killed or drained with handoff) the client
reconnects with exponential backoff and resumes the stream (`streamd.clients.resume`): the same
daemon continues it, another one gets the audio replayed; audio captured meanwhile is kept and
sent, so no word is lost and times stay relative to the start of listening. The first Ctrl-C
sends ``stop`` and prints the last finals; a second one quits at once.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

from streamd.clients.common import Backoff, LiveDisplay, StreamError, explain, read_token, retry_delay
from streamd.clients.resume import ResumingStream
from streamd.protocol import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, Final, Start, Summary

BLOCK_S = 0.05  # 50 ms per message
STOP_TIMEOUT_S = 30.0  # wait this long for the last final after `stop`


class MicrophoneError(Exception):
    """No usable input: sounddevice/PortAudio missing, unknown device, unsupported rate."""


def _sounddevice() -> Any:
    try:
        import sounddevice
    except (ImportError, OSError) as e:  # OSError: the PortAudio library is not installed
        raise MicrophoneError(f"{e}; install PortAudio (Debian: libportaudio2) and "
                              "`pip install 'streamd[mic]'`") from None
    return sounddevice


def print_devices(out: Any) -> None:
    """List input devices like `python -m sounddevice`; ``*`` marks the default."""
    sd = _sounddevice()
    default = sd.default.device[0]
    hostapis = sd.query_hostapis()
    inputs = [d for d in sd.query_devices() if d["max_input_channels"] > 0]
    for d in inputs:
        mark = "*" if d["index"] == default else " "
        out.write(f"{mark} {d['index']:3d}  {d['name']}  ({hostapis[d['hostapi']]['name']}, "
                  f"{d['max_input_channels']} ch, {d['default_samplerate']:g} Hz)\n")
    if not inputs:
        out.write("no input devices found (PortAudio sees no microphone: is one connected, and may this user "
                  "use it, e.g. in the audio group or a PulseAudio/PipeWire session?)\n")


def find_device(spec: str | None) -> dict[str, Any]:
    """The input device: an index, a unique part of a name, or None for the default."""
    sd = _sounddevice()
    device: int | str | None = int(spec) if spec is not None and spec.isdigit() else spec
    try:
        return dict(sd.query_devices(device, "input"))
    except (ValueError, sd.PortAudioError) as e:
        raise MicrophoneError(f"no input device {spec or '(default)'}: {e}; see --list-devices") from None


def capture_rate(device: dict[str, Any], requested: int | None) -> int:
    """The rate to open and declare: ``requested``, else the native rate clamped to 8-48 kHz."""
    if requested is not None:
        if not MIN_SAMPLE_RATE <= requested <= MAX_SAMPLE_RATE:
            raise MicrophoneError(f"--rate must be in {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz, got {requested}")
        return requested
    return min(MAX_SAMPLE_RATE, max(MIN_SAMPLE_RATE, int(device["default_samplerate"])))


class Microphone:
    """A 16-bit mono input stream whose blocks are read from the asyncio loop.

    Use as a context manager inside the running loop. Every block captured is read: result
    times are seconds since the device was opened.
    """

    def __init__(self, device: dict[str, Any], rate: int, on_status: Callable[[str], None]) -> None:
        self.device, self.rate = device, rate
        self._on_status = on_status
        self._blocks: asyncio.Queue[bytes] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stream: Any = None

    def __enter__(self) -> Microphone:
        sd = _sounddevice()
        self._loop = asyncio.get_running_loop()
        try:
            self._stream = sd.RawInputStream(device=self.device["index"], samplerate=self.rate, channels=1,
                                             dtype="int16", blocksize=round(self.rate * BLOCK_S),
                                             callback=self._callback)
            self._stream.start()
        except sd.PortAudioError as e:
            raise MicrophoneError(f"cannot open {self.device['name']!r} at {self.rate} Hz: {e}; "
                                  "try another --rate") from None
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stream.stop()
        self._stream.close()

    def _callback(self, indata: Any, frames: int, time: Any, status: Any) -> None:
        """PortAudio's thread: copy the block and hand it to the loop; never block here."""
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self._loop.call_soon_threadsafe(self._blocks.put_nowait, bytes(indata))
            if status:
                self._loop.call_soon_threadsafe(self._on_status, f"audio input: {status}")

    async def read(self) -> bytes:
        """The next block (s16le mono)."""
        return await self._blocks.get()

    def take_pending(self) -> list[bytes]:
        """The blocks captured but not read yet, without waiting."""
        blocks = []
        while not self._blocks.empty():
            blocks.append(self._blocks.get_nowait())
        return blocks



async def _show(stream: ResumingStream, display: LiveDisplay) -> None:
    async for result in stream.results():
        if isinstance(result, Final):
            display.final(result.text, result.start, result.end)
        else:
            display.partial(result.text)


async def _send(stream: ResumingStream, mic: Microphone) -> None:
    while True:
        await stream.send_audio(await mic.read())


async def listen(url: str, mic: Microphone, display: LiveDisplay, stop: asyncio.Event,
                 cafile: str | None = None, token: str | None = None) -> Summary | None:
    """Transcribe ``mic`` until ``stop`` is set, resuming the stream whenever the connection
    drops (retrying for as long as it takes); returns the summary.

    Raises:
        StreamError: an error that reconnecting cannot fix (e.g. ``unauthorized``).
    """
    start = Start(sample_rate=mic.rate, encoding="s16le", channels=1, interim_results=display.live)
    backoff = Backoff()
    while True:
        stream = ResumingStream(url, start, cafile, token, on_status=display.status, attempts=None)
        try:
            await stream.__aenter__()
            break
        except Exception as e:
            delay = retry_delay(e, backoff)
            if delay is None:
                raise
            display.status(f"{explain(url, e)}; trying again in {delay:.1f} s (Ctrl-C to stop)")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set():
            return None
    stopped = asyncio.ensure_future(stop.wait())
    ready = stream.ready
    assert ready is not None
    display.status(f"listening to {mic.device['name']!r} at {mic.rate} Hz; {ready.model} on "
                   f"{ready.device} ({ready.dtype}); Ctrl-C to stop")
    reader = asyncio.create_task(_show(stream, display))
    sender = asyncio.create_task(_send(stream, mic))
    try:
        await asyncio.wait({reader, sender, stopped}, return_when=asyncio.FIRST_COMPLETED)
        sender.cancel()
        if not stopped.done():
            await reader  # raises what ended the stream
            return stream.summary
        for block in mic.take_pending():
            await stream.send_audio(block)
        await stream.stop()
        await asyncio.wait_for(reader, STOP_TIMEOUT_S)
        return stream.summary
    finally:
        for task in (reader, sender, stopped):
            task.cancel()
        await asyncio.gather(reader, sender, stopped, return_exceptions=True)
        await stream.__aexit__(None, None, None)


async def _main(args: argparse.Namespace, display: LiveDisplay) -> int:
    stop = asyncio.Event()
    main = asyncio.current_task()
    assert main is not None

    def on_interrupt() -> None:
        if stop.is_set():
            main.cancel()  # second Ctrl-C: quit now
            return
        stop.set()
        display.status("stopping (Ctrl-C again to quit now)")

    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, on_interrupt)
    device = find_device(args.device)
    try:
        with Microphone(device, capture_rate(device, args.rate), display.status) as mic:
            summary = await listen(args.url, mic, display, stop, args.cafile, read_token(args.token_file))
    except asyncio.CancelledError:
        return 130
    if summary is not None:
        display.status(f"stopped: {display.finals} utterances, {summary.audio_seconds:.1f} s of audio")
    return 0


def run(args: argparse.Namespace) -> int:
    """Entry point of `streamd listen`."""
    try:
        if args.list_devices:
            print_devices(sys.stdout)
            return 0
        return asyncio.run(_main(args, LiveDisplay(sys.stdout, sys.stderr)))
    except MicrophoneError as e:
        print(f"streamd listen: {e}", file=sys.stderr)
        return 2
    except StreamError as e:
        print(f"streamd listen: {e}", file=sys.stderr)
        return 1
