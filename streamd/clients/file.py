"""`streamd transcribe FILE...`: transcribe audio files through a running daemon.

Files are read with soundfile (WAV, FLAC, OGG, ... at any rate and channel count) and sent as
s16le at their own rate and channel count: the daemon resamples and mixes to mono. Only what
the protocol cannot carry is converted here: rates outside 8-48 kHz are resampled to
``RESAMPLE_RATE`` (16 kHz) and more than 8 channels are mixed to mono.

Audio goes out in 100 ms messages, as fast as the daemon accepts them or, with ``realtime``,
each one when its audio would have been spoken (like a live source). Several files are streamed
concurrently (``jobs``); results are printed in the order of the files, each as soon as it and
the ones before it are done. A stream whose connection drops (network, daemon killed, drained
with handoff) resumes on the same daemon or replays to another one with no word lost or repeated
(`streamd.clients.resume`); a file whose stream fails otherwise for a reason that reconnecting
can fix (daemon full, overloaded) is sent again from the start.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import soundfile as sf
import soxr

from streamd.audio.files import unreadable
from streamd.clients.common import DEFAULT_URL, Backoff, explain, read_token, refused, retry_delay
from streamd.clients.output import EXTENSIONS, Transcript, render
from streamd.clients.progress import Progress
from streamd.clients.resume import RECONNECT_ATTEMPTS, ResumingStream
from streamd.protocol import MAX_CHANNELS, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, Final, Start

CHUNK_S = 0.1
ATTEMPTS = 5
# The client knows nothing of the model: a file outside the protocol's rates is sent at the rate
# speech models take (the shipped one's), which loses nothing the daemon would keep.
RESAMPLE_RATE = 16_000
READ_BLOCK = 1 << 16  # frames converted at a time: a long float file is never held as floats whole


def to_int16(samples: np.ndarray) -> np.ndarray:
    """Float samples in -1..1 (a file's full scale) as int16, clipped."""
    return np.clip(np.rint(samples * 32768), -32768, 32767).astype(np.int16)


@dataclass(frozen=True)
class Audio:
    """Interleaved s16le PCM ready to send, with the format to declare in ``start``."""

    pcm: bytes
    rate: int
    channels: int

    @property
    def duration(self) -> float:
        return len(self.pcm) / (2 * self.channels * self.rate)


@dataclass(frozen=True)
class Options:
    """How to stream: the daemon, real-time pacing, files at once, the CA for wss://, the token;
    `on_status` hears of reconnections and retries; `reconnect_attempts`: a dropped stream's."""

    url: str = DEFAULT_URL
    realtime: bool = False
    jobs: int = 4
    cafile: str | None = None
    token: str | None = None
    on_status: Callable[[str], None] = lambda message: None
    reconnect_attempts: int = RECONNECT_ATTEMPTS


def load_audio(path: str) -> Audio:
    """Read a file as 16-bit PCM in a format the protocol accepts. Samples are read as floats and
    scaled here: libsndfile does not scale float files read as integers (they would be silence)."""
    with sf.SoundFile(path) as f:
        rate, mix = f.samplerate, f.channels > MAX_CHANNELS
        parts = [np.zeros((0, 1 if mix else f.channels), np.int16)]
        parts += [to_int16(b.mean(axis=1, keepdims=True) if mix else b)
                  for b in f.blocks(READ_BLOCK, dtype="float32", always_2d=True)]
    data = np.concatenate(parts)
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        data, rate = soxr.resample(data, rate, RESAMPLE_RATE), RESAMPLE_RATE
    return Audio(np.ascontiguousarray(data).tobytes(), rate, data.shape[1])


async def _send(session: ResumingStream, audio: Audio, realtime: bool, sent: Callable[[float], None]) -> None:
    frame = 2 * audio.channels
    step = round(audio.rate * CHUNK_S) * frame
    clock = asyncio.get_running_loop()
    t0 = clock.time()
    for offset in range(0, len(audio.pcm), step):
        seconds = min(offset + step, len(audio.pcm)) / frame / audio.rate
        if realtime:  # on an absolute schedule, so sleeping late never accumulates drift
            await asyncio.sleep(max(0.0, t0 + seconds - clock.time()))
        await session.send_audio(audio.pcm[offset: offset + step])
        sent(seconds)
    await session.stop()


async def _stream(audio: Audio, options: Options, sent: Callable[[float], None], finals: list[Final],
                  status: Callable[[str], None]) -> None:
    """Stream `audio`, adding its finals to `finals` as they come (kept if it fails later)."""
    start = Start(sample_rate=audio.rate, encoding="s16le", channels=audio.channels,
                  interim_results=False, word_times=True)
    async with ResumingStream(options.url, start, options.cafile, token=options.token, on_status=status,
                              attempts=options.reconnect_attempts) as session:
        sender = asyncio.create_task(_send(session, audio, options.realtime, sent))
        try:
            async for r in session.results():
                if isinstance(r, Final):
                    finals.append(r)
            await sender
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)


async def transcribe_file(path: str, options: Options,
                          sent: Callable[[float], None] = lambda seconds: None) -> Transcript:
    """Stream one file and collect its finals; errors are returned in the transcript."""
    try:
        audio = await asyncio.to_thread(load_audio, path)
    except (OSError, sf.LibsndfileError) as e:
        return Transcript(path, 0.0, error=unreadable(path, e))
    except ValueError as e:
        return Transcript(path, 0.0, error=str(e))
    backoff = Backoff()
    best: list[Final] = []  # the finals of the attempt that got furthest
    attempt = 1

    def status(message: str) -> None:
        options.on_status(f"{path}: {message}")

    while True:
        sent(0.0)
        finals: list[Final] = []
        try:
            await _stream(audio, options, sent, finals, status)
            return Transcript(path, audio.duration, finals)
        except Exception as e:
            best = max(best, finals, key=len)
            # Nothing listens there: say so now (a daemon that went away mid-stream was already
            # waited for by the reconnections).
            delay = None if refused(e) else retry_delay(e, backoff)
            if delay is None or attempt == ATTEMPTS:
                return Transcript(path, audio.duration, best, error=explain(options.url, e))
            status(f"{explain(options.url, e)}; sending the file again in {delay:.1f} s")
        attempt += 1
        await asyncio.sleep(delay)


def _duration(path: str) -> float:
    """From the header alone (0 for unreadable files: their error comes later)."""
    try:
        return float(sf.info(path).duration)
    except (OSError, sf.LibsndfileError, ValueError):
        return 0.0


async def transcribe_files(paths: Sequence[str], options: Options, emit: Callable[[Transcript], None],
                           progress_out: TextIO | None = None) -> list[Transcript]:
    """Stream ``paths``, at most ``options.jobs`` at once; ``emit`` each result in order.

    A progress bar is drawn on ``progress_out`` if given.
    """
    durations = await asyncio.to_thread(lambda: [_duration(p) for p in paths])
    progress = Progress(durations, progress_out or sys.stderr, enabled=progress_out is not None)
    slots = asyncio.Semaphore(options.jobs)
    report = options.on_status

    def status(message: str) -> None:
        progress.clear()
        report(message)

    options = dataclasses.replace(options, on_status=status)

    async def one(i: int) -> Transcript:
        async with slots:
            t = await transcribe_file(paths[i], options, lambda seconds: progress.update(i, seconds))
        progress.done(i)
        return t

    tasks = [asyncio.create_task(one(i)) for i in range(len(paths))]
    results = []
    for task in tasks:
        results.append(await task)
        progress.clear()
        emit(results[-1])
    return results


def _writer(fmt: str, output_dir: str | None, named: bool) -> Callable[[Transcript], None]:
    def emit(t: Transcript) -> None:
        if t.error is not None and fmt != "jsonl":
            kept = f" (the {len(t.finals)} utterances before it are kept)" if t.finals else ""
            print(f"streamd transcribe: {t.file}: {t.error}{kept}", file=sys.stderr)
            if not t.finals:
                return
        if t.error is None and not t.text:  # stdout stays as the format has it; the person is told
            print(f"streamd transcribe: {t.file}: no speech heard in {t.duration:.1f} s of audio", file=sys.stderr)
        text = render(t, fmt, named)
        if output_dir is None:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            Path(output_dir, f"{Path(t.file).stem}.{EXTENSIONS[fmt]}").write_text(text, encoding="utf-8")
    return emit


def run(args: argparse.Namespace) -> int:
    """Entry point of `streamd transcribe`; exit status 1 if any file failed."""
    if args.format in ("srt", "vtt") and len(args.files) > 1 and args.output_dir is None:
        raise ValueError(f"--format {args.format} with several files needs --output-dir")
    if args.output_dir is not None:
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    options = Options(args.url, args.realtime, args.jobs, args.cafile, read_token(args.token_file),
                      on_status=lambda message: print(f"streamd transcribe: {message}", file=sys.stderr))
    emit = _writer(args.format, args.output_dir, named=len(args.files) > 1)
    progress_out = sys.stderr if not args.no_progress and sys.stderr.isatty() else None
    results = asyncio.run(transcribe_files(args.files, options, emit, progress_out))
    return 1 if any(t.error is not None for t in results) else 0
