"""`streamd listen`: live transcription of a microphone.

Capture is a sounddevice (PortAudio) input stream, 16-bit mono at the device's native rate.
Its callback runs on PortAudio's thread and only hands a copy of each block to the asyncio loop
(``call_soon_threadsafe``); the loop sends the blocks. The client does no resampling: it
declares the native rate in ``start`` and the daemon resamples (soxr, high quality). Devices
whose native rate is above 48 kHz, the protocol's limit, are opened at 48 kHz and PortAudio
converts.

If the daemon goes away (restart, drain, crash) the client reconnects with exponential backoff;
audio captured while disconnected is dropped, and times stay relative to the start of
listening. The first Ctrl-C sends ``stop`` and prints the last finals; a second one quits at
once.
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

from streamd.clients.common import (Backoff, LiveDisplay, Session, StreamError, open_stream,
                                    read_token, retry_delay)
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
    for d in sd.query_devices():
        if d["max_input_channels"] > 0:
            mark = "*" if d["index"] == default else " "
            out.write(f"{mark} {d['index']:3d}  {d['name']}  ({hostapis[d['hostapi']]['name']}, "
                      f"{d['max_input_channels']} ch, {d['default_samplerate']:g} Hz)\n")


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

    Use as a context manager inside the running loop. :attr:`seconds` is the audio taken from
    the stream so far (read or discarded): the clock that result times are reported on.
    """

    def __init__(self, device: dict[str, Any], rate: int, on_status: Callable[[str], None]) -> None:
        self.device, self.rate = device, rate
        self._on_status = on_status
        self._blocks: asyncio.Queue[bytes] = asyncio.Queue()
        self._frames = 0
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

    @property
    def seconds(self) -> float:
        return self._frames / self.rate

    async def read(self) -> bytes:
        """The next block (s16le mono)."""
        block = await self._blocks.get()
        self._frames += len(block) // 2
        return block

    def take_pending(self) -> list[bytes]:
        """The blocks captured but not read yet, without waiting."""
        blocks = []
        while not self._blocks.empty():
            block = self._blocks.get_nowait()
            self._frames += len(block) // 2
            blocks.append(block)
        return blocks

    def discard(self) -> float:
        """Drop the blocks waiting to be read; return their duration in seconds."""
        return sum(len(b) // 2 for b in self.take_pending()) / self.rate


async def _show(session: Session, display: LiveDisplay, offset: float) -> None:
    async for result in session.results():
        if isinstance(result, Final):
            display.final(result.text, offset + result.start, offset + result.end)
        else:
            display.partial(result.text)


async def _send(session: Session, mic: Microphone) -> None:
    while True:
        await session.send_audio(await mic.read())


async def _stream(session: Session, mic: Microphone, display: LiveDisplay, stop: asyncio.Event) -> bool:
    """Stream until ``stop`` is set (True) or the server ends the session (False).

    Raises whatever ended the session abnormally (error message, lost connection).
    """
    reader = asyncio.create_task(_show(session, display, mic.seconds))
    sender = asyncio.create_task(_send(session, mic))
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({reader, sender, stopped}, return_when=asyncio.FIRST_COMPLETED)
        sender.cancel()
        if not stopped.done():  # the server ended the stream or the connection broke
            await reader
            return False
        for block in mic.take_pending():
            await session.send_audio(block)
        await session.stop()
        await asyncio.wait_for(reader, STOP_TIMEOUT_S)
        return True
    finally:
        for task in (reader, sender, stopped):
            task.cancel()
        await asyncio.gather(reader, sender, stopped, return_exceptions=True)


async def listen(url: str, mic: Microphone, display: LiveDisplay, stop: asyncio.Event,
                 cafile: str | None = None, token: str | None = None) -> Summary | None:
    """Transcribe ``mic`` until ``stop`` is set, reconnecting whenever the daemon goes away.

    Returns the summary of the last session (None if it ended without one).

    Raises:
        StreamError: an error that reconnecting cannot fix (e.g. ``unauthorized``).
    """
    backoff = Backoff()
    start = Start(sample_rate=mic.rate, encoding="s16le", channels=1, interim_results=display.live)
    reconnecting = False
    while not stop.is_set():
        try:
            async with open_stream(url, start, cafile, token=token) as session:
                backoff.reset()
                dropped = mic.discard()  # live audio is not worth sending late
                if reconnecting:
                    display.status(f"reconnected; dropped {dropped:.1f} s of audio captured while disconnected")
                ready = session.ready
                display.status(f"listening to {mic.device['name']!r} at {mic.rate} Hz; {ready.model} on "
                               f"{ready.device} ({ready.dtype}); Ctrl-C to stop")
                if await _stream(session, mic, display, stop):
                    return session.summary
            reconnecting = True
            delay = backoff.next()
            display.status(f"the daemon ended the stream; reconnecting in {delay:.1f} s")
        except Exception as e:
            maybe = retry_delay(e, backoff)
            if maybe is None:
                raise
            delay, reconnecting = maybe, True
            display.status(f"{url}: {str(e) or type(e).__name__}; reconnecting in {delay:.1f} s")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
    return None


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
        display.status(f"stopped: {summary.utterances} utterances, {summary.audio_seconds:.1f} s of audio")
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
