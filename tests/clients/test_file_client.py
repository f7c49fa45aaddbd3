"""`streamd transcribe` against a real daemon: formats, rates, channels, pacing, output formats."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import soxr

from client_support import PushRecorder, speech
from conftest import FIXTURES, REPO
from daemon import TINY, config, running, stream_pcm
from streamd.config import EndpointingConfig
from streamd.clients.file import Options, load_audio, transcribe_file, transcribe_files
from streamd.clients.output import Transcript, render
from streamd.protocol import Final

WAVS = sorted(FIXTURES.glob("in*.wav"))


def squeeze(text: str) -> str:
    """Text without spaces: utterance boundaries may fall inside a word."""
    return "".join(text.split())


async def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -X importtime -m streamd ARGS` without blocking the daemon's event loop."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-X", "importtime", "-m", "streamd", *args, cwd=REPO,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(args, proc.returncode, out.decode(), err.decode())


def imported_torch(stderr: str) -> bool:
    return any(line.startswith("import time:") and "torch" in line for line in stderr.splitlines())


def test_jsonl_of_several_files_matches_streamd_decode(tmp_path: Path) -> None:
    flac = tmp_path / "in3.flac"  # FLAC is lossless: same samples, same transcript
    sf.write(flac, sf.read(str(WAVS[3]), dtype="int16")[0], 16000, format="FLAC")
    files = [str(WAVS[0]), str(flac), str(WAVS[2])]
    decoded = subprocess.run([sys.executable, "-m", "streamd", "decode", "--model", str(TINY), *map(str, WAVS)],
                             capture_output=True, text=True, timeout=300, check=True).stdout
    reference = {Path(json.loads(line)["file"]).stem: json.loads(line)["text"] for line in decoded.splitlines()}

    async def main() -> None:
        async with running(config()) as (_, url):
            done = await run_cli("transcribe", "--url", url, "--format", "jsonl", "--jobs", "3", *files)
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert [line["file"] for line in lines] == files  # in input order, one line per file
        for line in lines:
            stem = Path(line["file"]).stem
            ref = next(text for name, text in reference.items() if name.startswith(stem))
            assert squeeze(line["text"]) == squeeze(ref)
            assert line["text"] == " ".join(u["text"] for u in line["utterances"])
        assert not imported_torch(done.stderr)

    asyncio.run(main())


def as_rate(rate: int, channels: int) -> np.ndarray:
    """The padded fixture sentence at ``rate`` (int16), ``channels`` of it (right ones quieter)."""
    mono = soxr.resample(speech(pad_s=0.5), 16000, rate)
    return np.stack([(mono * 0.5 ** c).astype(np.int16) for c in range(channels)], axis=1)


FORMATS = [(8000, 1), (16000, 1), (44100, 1), (48000, 1), (44100, 2), (16000, 2)]


def test_any_rate_and_channel_count_is_sent_as_it_is(tmp_path: Path) -> None:
    """The client declares the file's own rate and channels: its transcript is the one the daemon gives
    for exactly those samples through the raw protocol (a wrong rate or channel count would change it)."""
    paths = []
    for rate, channels in FORMATS:
        paths.append(str(tmp_path / f"s{rate}_{channels}ch.wav"))
        sf.write(paths[-1], as_rate(rate, channels), rate, subtype="PCM_16")

    async def main() -> None:
        async with running(config()) as (_, url):
            got: list[Transcript] = []
            await transcribe_files(paths, Options(url, jobs=len(paths)), got.append)
            for (rate, channels), path, t in zip(FORMATS, paths, got):
                assert t.file == path and t.error is None
                assert t.duration == pytest.approx(len(as_rate(rate, channels)) / rate)
                start = {"type": "start", "sample_rate": rate, "encoding": "s16le", "channels": channels}
                raw = await stream_pcm(url, as_rate(rate, channels).tobytes(), np.random.default_rng(0), start)
                assert [f.text for f in t.finals] == [f["text"] for f in raw.of("final")], (rate, channels)
                assert t.text

    asyncio.run(main())


def test_rates_and_channels_outside_the_protocol_are_converted(tmp_path: Path) -> None:
    wide = tmp_path / "wide.wav"
    sf.write(wide, np.zeros((9600, 10), np.int16), 96000, subtype="PCM_16")
    audio = load_audio(str(wide))
    assert (audio.rate, audio.channels) == (16000, 1)
    assert audio.duration == pytest.approx(0.1)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
def test_int_and_float_files_of_any_width_give_the_same_words(tmp_path: Path) -> None:
    """Float WAVs were read as silence (libsndfile does not scale floats read as integers)."""
    sentence = "please call me back in ten minutes"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(tmp_path / "e.wav"), sentence], check=True)
    audio, rate = sf.read(str(tmp_path / "e.wav"), dtype="float32")  # floats: written scaled in every format
    subtypes = ("PCM_16", "PCM_24", "PCM_U8", "FLOAT", "DOUBLE")
    paths = [str(tmp_path / f"{st}.wav") for st in subtypes]
    for st, path in zip(subtypes, paths):
        sf.write(path, audio, rate, subtype=st)
    pcm = {st: np.frombuffer(load_audio(path).pcm, np.int16) for st, path in zip(subtypes, paths)}
    for st in ("PCM_24", "FLOAT", "DOUBLE"):  # 16-bit values in them: the same samples exactly
        assert np.array_equal(pcm[st], pcm["PCM_16"]), st
    assert np.abs(pcm["PCM_U8"].astype(int) - pcm["PCM_16"]).max() <= 256  # one 8-bit step

    async def main() -> list[Transcript]:
        async with running(config(model=None)) as (_, url):
            got: list[Transcript] = []
            await transcribe_files(paths, Options(url, jobs=len(paths)), got.append)
            return got

    assert [t.text for t in asyncio.run(main())] == [sentence] * len(paths)


@pytest.mark.parametrize("realtime", [True, False])
def test_realtime_pacing(tmp_path: Path, realtime: bool) -> None:
    path = tmp_path / "speech.wav"
    sf.write(path, speech(pad_s=0.0), 16000, subtype="PCM_16")
    duration = sf.info(str(path)).duration

    async def main() -> None:
        async with running(config()) as (app, url):
            received = PushRecorder(app)
            began = time.monotonic()
            t = await transcribe_file(str(path), Options(url, realtime=realtime))
            received.stop()
        assert t.error is None and t.text
        heard = np.cumsum([c.size / 16000 for c in received.chunks])
        assert heard[-1] == pytest.approx(duration)
        if realtime:
            # never ahead of the clock, and all of it took the file's duration
            assert all(h <= (at - began) + 0.05 for h, at in zip(heard, received.times))
            assert received.times[-1] - began >= duration - 0.05
        else:
            assert received.times[-1] - received.times[0] < duration / 4

    asyncio.run(main())


SRT_CUE = re.compile(r"(\d+)\n(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})\n((?:.+\n)+)")
VTT_CUE = re.compile(r"(\d\d):(\d\d):(\d\d)\.(\d{3}) --> (\d\d):(\d\d):(\d\d)\.(\d{3})\n((?:.+\n)+)")


def parse_cues(text: str, cue: re.Pattern[str], numbered: bool) -> list[tuple[float, float, str]]:
    """Parse subtitles strictly: cues separated by one blank line, nothing else; check the times."""
    blocks = text.split("\n\n")
    assert blocks[-1] == "", "ends with a blank line"
    cues = []
    for i, block in enumerate(blocks[:-1], 1):
        m = cue.fullmatch(block + "\n")
        assert m, block
        g = [int(x) for x in m.groups()[:-1]]
        if numbered:
            assert g.pop(0) == i
        start = g[0] * 3600 + g[1] * 60 + g[2] + g[3] / 1000
        end = g[4] * 3600 + g[5] * 60 + g[6] + g[7] / 1000
        assert 0 <= start < end
        assert all(len(line) <= 42 for line in m.groups()[-1].splitlines())
        cues.append((start, end, m.groups()[-1].strip()))
    assert [c[0] for c in cues] == sorted(c[0] for c in cues)
    return cues


def test_srt_and_vtt_are_valid(tmp_path: Path) -> None:
    long_file = str(WAVS[1])  # 4.4 s of tones: a long gibberish transcript, several cues

    async def main() -> None:
        async with running(config()) as (_, url):
            srt = await run_cli("transcribe", "--url", url, "--format", "srt", long_file)
            vtt = await run_cli("transcribe", "--url", url, "--format", "vtt", long_file)
            text = await run_cli("transcribe", "--url", url, long_file)
            jsonl = await run_cli("transcribe", "--url", url, "--format", "jsonl", long_file)
            several = await run_cli("transcribe", "--url", url, "--format", "srt", str(WAVS[0]), str(WAVS[2]))
            into_dir = await run_cli("transcribe", "--url", url, "--format", "srt", "--output-dir", str(tmp_path),
                                     str(WAVS[0]), str(WAVS[2]))
        assert srt.returncode == vtt.returncode == text.returncode == 0
        cues = parse_cues(srt.stdout, SRT_CUE, numbered=True)
        assert len(cues) >= 3 and cues[-1][1] <= 4.37  # within the audio (not into the last chunk's padding)
        # an utterance starts where its first word does, in every format: its first cue's start
        utterances = json.loads(jsonl.stdout)["utterances"]
        assert len(utterances) >= 2 and {u["start"] for u in utterances} <= {round(c[0], 3) for c in cues}
        assert all(u["end"] <= 4.37 for u in utterances)
        assert squeeze(" ".join(c[2] for c in cues)) == squeeze(text.stdout)
        assert text.stdout.splitlines() == [u["text"] for u in utterances]  # one line per utterance
        assert vtt.stdout.startswith("WEBVTT\n\n")
        assert parse_cues(vtt.stdout[len("WEBVTT\n\n"):], VTT_CUE, numbered=False) == cues
        assert several.returncode == 2 and "--output-dir" in several.stderr
        assert into_dir.returncode == 0 and into_dir.stdout == ""
        for wav in (WAVS[0], WAVS[2]):
            assert parse_cues((tmp_path / f"{wav.stem}.srt").read_text(), SRT_CUE, numbered=True)

    asyncio.run(main())


def test_plain_text_is_one_line_per_utterance() -> None:
    finals = [Final(0, "turn the lights off", 0.3, 1.6, 1.6, "endpoint"), Final(1, "", 1.6, 2.0, 2.0, "endpoint"),
              Final(2, "and the radio", 2.4, 3.1, 3.2, "end_of_stream")]
    t = Transcript("a.wav", 3.2, finals)
    assert render(t, "text", named=False) == "turn the lights off\nand the radio\n"
    assert render(t, "text", named=True) == "a.wav: turn the lights off\na.wav: and the radio\n"
    assert render(Transcript("b.wav", 1.0, finals[1:2]), "text", named=True) == "b.wav:\n"
    assert render(Transcript("b.wav", 1.0), "text", named=False) == ""


def test_a_file_without_words_is_said_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    from streamd.clients.file import _writer

    silent = Transcript("quiet.wav", 3.0, [Final(0, "", 0.0, 3.0, 3.0, "end_of_stream")])
    for fmt in ("text", "jsonl"):
        _writer(fmt, None, named=False)(silent)
        out, err = capsys.readouterr()
        assert err == "streamd transcribe: quiet.wav: no speech heard in 3.0 s of audio\n"
        assert out == ("" if fmt == "text" else render(silent, "jsonl", named=False))
    _writer("text", None, named=False)(Transcript("a.wav", 1.0, [Final(0, "hello", 0.1, 0.5, 1.0, "end_of_stream")]))
    assert capsys.readouterr() == ("hello\n", "")


def test_a_file_that_cannot_be_read_is_reported_and_the_others_still_transcribed(tmp_path: Path) -> None:
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF????WAVEnot audio")

    async def main() -> None:
        async with running(config()) as (_, url):
            done = await run_cli("transcribe", "--url", url, "--format", "jsonl", str(broken), str(WAVS[2]))
        assert done.returncode == 1
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert lines[0]["file"] == str(broken) and lines[0]["error"]
        assert lines[1]["file"] == str(WAVS[2]) and lines[1]["text"]

    asyncio.run(main())


def test_no_daemon_is_said_at_once_with_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "speech.wav"
    sf.write(path, speech(pad_s=0.0), 16000, subtype="PCM_16")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"ws://127.0.0.1:{s.getsockname()[1]}"
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "streamd", "transcribe", "--url", url, str(path)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert time.monotonic() - began < 5  # was 8 s of silent retries
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"streamd transcribe: {path}: {url}: connection refused: is `streamd serve` running there?\n"


def test_a_daemon_that_goes_away_mid_file_is_reported_and_the_finals_received_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "long.wav"
    sf.write(path, np.concatenate([speech(pad_s=0.5)] * 3), 16000, subtype="PCM_16")
    status: list[str] = []

    async def main() -> Transcript:
        cfg = dataclasses.replace(config(), endpointing=EndpointingConfig(max_utterance_ms=1000))
        options = Options(realtime=True, on_status=status.append, reconnect_attempts=1)
        async with running(cfg) as (_, url):
            options = dataclasses.replace(options, url=url)
            progress = asyncio.Event()
            task = asyncio.create_task(transcribe_file(str(path), options,
                                                       lambda s: progress.set() if s >= 3.0 else None))
            await asyncio.wait_for(progress.wait(), 30)
        return await asyncio.wait_for(task, 60)

    t = asyncio.run(main())
    assert t.error is not None and "is `streamd serve` running" in t.error
    assert len(t.finals) >= 2 and t.text  # the utterances of the first 3 s
    assert any("the daemon shut down" in m for m in status), status  # not silent meanwhile
    assert all(m.startswith(f"{path}: ") for m in status)
    line = json.loads(render(t, "jsonl", named=False))
    assert line["error"] == t.error and line["text"] == t.text


def test_transcribe_files_passes_each_file_s_status_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `streamd transcribe` runs: a file's reconnection and retry messages reach `on_status`
    (they recursed into themselves: the CLI printed `maximum recursion depth exceeded` as the
    file's error when its daemon went away, and no status at all)."""
    async def one(path: str, options: Options, sent: Any) -> Transcript:
        options.on_status(f"{path}: reconnecting")
        return Transcript(path, 1.0, [])

    monkeypatch.setattr("streamd.clients.file.transcribe_file", one)
    seen: list[str] = []
    done = asyncio.run(transcribe_files(["a.wav", "b.wav"], Options(on_status=seen.append), lambda t: None))
    assert seen == ["a.wav: reconnecting", "b.wav: reconnecting"]
    assert [t.error for t in done] == [None, None]
