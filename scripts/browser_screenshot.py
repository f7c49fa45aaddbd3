"""The README's screenshot of the browser page (docs/browser-page.png), served by the shipped
default model, with headless Chromium's fake microphone playing people from
tests/fixtures/real-speech: a first session of one utterance, then a second one while it listens.

    python scripts/browser_screenshot.py [--out docs/browser-page.png]

Needs Debian's chromium. Starts `python -m streamd serve` on a free port and stops it after.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "clients"))
from chromium_cdp import launch  # noqa: E402  (tests/clients/chromium_cdp.py: Chromium over DevTools)

CLIPS = ("common_voice_en_75331.ogg", "common_voice_en_644382.ogg", "common_voice_en_664162.ogg",
         "3005-163389-0002.ogg")
GAP_S = 1.2  # silence after each clip: each is an utterance of its own
CLICK = "document.getElementById('toggle').click()"
FINALS = "document.querySelectorAll('.session:nth-child({}) .finals li').length >= {}".format


def speech_wav(path: Path) -> None:
    """The clips one after another at 16 kHz, each followed by silence."""
    parts = [np.zeros(8000, np.float32)]
    for name in CLIPS:
        clip, rate = sf.read(REPO / "tests" / "fixtures" / "real-speech" / name, dtype="float32")
        assert rate == 16000, name
        parts += [clip, np.zeros(round(GAP_S * rate), np.float32)]
    sf.write(path, np.concatenate(parts), 16000, subtype="PCM_16")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, daemon: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if daemon.poll() is not None:
            raise SystemExit(f"streamd serve exited with status {daemon.returncode}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1):
                return
        except OSError:
            asyncio.run(asyncio.sleep(0.1))
    raise SystemExit("streamd serve did not get ready in 60 s")


async def shoot(url: str, wav: Path, profile: Path, out: Path) -> None:
    flags = ["--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}",
             "--use-fake-ui-for-media-stream", "--autoplay-policy=no-user-gesture-required", "--hide-scrollbars"]
    async with launch("chromium", profile, flags, profile.parent / "chromium.log") as browser:
        page = await browser.new_page()
        await page.send("Emulation.setDeviceMetricsOverride", width=820, height=430, deviceScaleFactor=1, mobile=False)
        await page.goto(url + "/")
        await page.evaluate(CLICK, user_gesture=True)
        await page.wait_for(FINALS(1, 1), 60)
        await page.evaluate(CLICK, user_gesture=True)
        await page.wait_for("document.body.dataset.state === 'closed'", 30)
        await page.evaluate(CLICK, user_gesture=True)
        await page.wait_for(FINALS(2, 3), 90)
        await page.wait_for("document.getElementById('level').value > -40", 30)
        await page.screenshot(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "browser-page.png")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        speech_wav(wav)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
        daemon = subprocess.Popen([sys.executable, "-m", "streamd", "serve", "--port", str(port), "--admin-socket", ""],
                                  env=env, cwd=tmp)
        try:
            wait_ready(url, daemon)
            asyncio.run(shoot(url, wav, Path(tmp) / "profile", args.out))
        finally:
            daemon.terminate()
            daemon.wait(30)
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
